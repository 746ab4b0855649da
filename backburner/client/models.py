"""What the client returns: the API's own response models, so the two cannot drift."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..api.schemas import Accepted, BatchView, JobView, RequestCounts, StatsView, UsageView
from ..models import TERMINAL_STATUSES, Event, JobStatus, is_terminal_event

__all__ = [
    "Batch",
    "Event",
    "JobStatus",
    "RequestCounts",
    "Stats",
    "Submission",
    "Task",
    "TaskPage",
    "Usage",
    "is_terminal_event",
]


class Task(JobView):
    """A job as ``GET /v1/tasks/{id}`` shows it (the API's ``JobView``)."""

    @property
    def is_terminal(self) -> bool:
        """True once the job is completed, failed or cancelled: nothing changes it again."""
        return self.status in TERMINAL_STATUSES


class Batch(BatchView):
    """A batch as ``GET /v1/batches/{id}`` shows it (the API's ``BatchView``)."""

    @property
    def is_terminal(self) -> bool:
        """True once the batch is completed, failed or cancelled."""
        return self.status in TERMINAL_STATUSES

    @property
    def done(self) -> int:
        """How many of its requests have ended (completed, failed or cancelled)."""
        counts = self.request_counts
        return counts.completed + counts.failed + counts.cancelled


class Submission(Accepted):
    """The answer to submit/generate: the task id and where to poll or stream it."""

    created: bool = Field(
        description="True if this call created the job; False if the Idempotency-Key given "
        "had already created it (an idempotent repeat: the same job comes back)."
    )


class TaskPage(BaseModel):
    """One page of a listing; pass ``next_cursor`` back as ``cursor`` for the next."""

    data: list[Task]
    next_cursor: str | None = None


Stats = StatsView
"""Queue depth by priority, jobs processing, DLQ size, workers seen lately."""

Usage = UsageView
"""The caller's tenant, its jobs in flight and its limits (``GET /v1/usage``)."""
