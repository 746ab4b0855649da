"""How long jobs of a type take, from the recent completed ones (not a constant)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from ..models import Job, JobStatus

if TYPE_CHECKING:
    from ..app import Backburner

SAMPLE = 50
"""How many recent completions an estimate averages."""
SCAN = 500
"""How many recent completions of a type are read to find SAMPLE of one model."""
FRESH_S = 5.0


class DurationEstimator:
    """Average run time of the last completed jobs of a type (and model), cached briefly."""

    def __init__(self, bb: Backburner) -> None:
        self.bb = bb
        self._cache: dict[tuple[str, str | None], tuple[float, float | None]] = {}

    async def estimate(self, task_type: str, model: str | None = None) -> float | None:
        key = (task_type, model)
        cached = self._cache.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < FRESH_S:
            return cached[1]
        page = await self.bb.backend.list_jobs(
            status=JobStatus.COMPLETED, type=task_type, limit=SAMPLE if model is None else SCAN
        )
        durations = [
            job.finished_at - job.started_at
            for job in page.jobs
            if job.finished_at is not None
            and job.started_at is not None
            and (model is None or job.input.get("model") == model)
        ][:SAMPLE]
        value = round(sum(durations) / len(durations), 3) if durations else None
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = (now, value)
        return value

    async def for_job(self, job: Job) -> tuple[float | None, float | None]:
        """(typical total, estimated remaining) in seconds for this job now."""
        model = job.input.get("model") if isinstance(job.input.get("model"), str) else None
        typical = await self.estimate(job.type, model)
        if job.is_terminal:
            return typical, 0.0
        now = self.bb.clock.now()
        # A job not due yet (delayed, or waiting out a retry's backoff) starts at run_at.
        due_in = max(0.0, job.run_at - now) if job.status == JobStatus.QUEUED else 0.0
        if typical is None:
            return None, round(due_in, 3) if due_in else None
        if job.started_at is not None and job.status == JobStatus.PROCESSING:
            return typical, round(max(0.0, typical - (now - job.started_at)), 3)
        return typical, round(due_in + typical, 3)


def poll_after(remaining: float | None) -> int:
    """Seconds a client should wait before polling again: 1..30."""
    if remaining is None:
        return 1
    return max(1, min(30, math.ceil(remaining)))
