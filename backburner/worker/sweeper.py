"""The sweeper: re-queues jobs whose lease expired and deletes jobs past their TTL.

Every step is idempotent (each transition re-checks the fence and the expired lease), so every
worker runs one and any number may run at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backends.base import Fail, RetryAt
from ..errors import LeaseLostError
from ..models import ErrorInfo
from ..observability.logs import job_fields

if TYPE_CHECKING:
    from ..app import Backburner

log = logging.getLogger("backburner.sweeper")


@dataclass(frozen=True, slots=True)
class SweepReport:
    requeued: int
    failed: int
    purged: int


async def sweep_once(app: Backburner, *, limit: int = 1000) -> SweepReport:
    """One pass: expired leases → retry (or DLQ when out of attempts); expired jobs → deleted."""
    now = app.clock.now()
    requeued = failed = 0
    for job in await app.backend.expired_leases(now=now, limit=limit):
        error = ErrorInfo(
            type="lease_expired",
            message=f"worker {job.worker_id} stopped renewing its lease (crashed or stalled)",
            retryable=True,
        )
        # The worker died rather than the job failing: retry at once, no backoff.
        outcome = app.retry_policy.after_failure(job, error, 0.0, now=now)
        try:
            stored = await app.backend.finish(
                job.task_id, job.fence, outcome, now=now, only_if_lease_expired=True
            )
        except LeaseLostError:
            continue  # another sweeper, a late heartbeat or a cancel got there first
        log.warning(
            "job %s: %s", job.task_id, error.message, extra=job_fields(job, "lease_expired")
        )
        if isinstance(outcome, RetryAt):
            requeued += 1
            await app.hooks.retry(stored, error)
        elif isinstance(outcome, Fail):
            failed += 1
            log.warning(
                "job %s failed for good (%s): it is in the dead-letter queue",
                job.task_id,
                outcome.error.type,
                extra=job_fields(stored, "dead_lettered"),
            )
            await app.hooks.fail(stored)
    purged = await app.backend.purge_expired(now=now, limit=limit)
    return SweepReport(requeued, failed, purged)
