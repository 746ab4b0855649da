"""Per-tenant admission and fair-share arithmetic shared by the backends that run it in
Python (memory, SQLite); the Redis backend does the same in Lua (``redis_lua/``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import QuotaExceededError, SubmitRateLimitedError
from .base import NewJob, Quota

RATE_WINDOW_S = 60.0
"""``Quota.per_minute`` is per this many seconds."""


def rate_check(tat: float | None, now: float, per_minute: int) -> tuple[float, float]:
    """GCRA: (new theoretical arrival time to store, 0.0) when a submission may go ahead, else
    (the unchanged ``tat``, seconds until it may). ``tat`` is the stored value (None: never
    submitted). The bucket holds ``per_minute`` tokens and refills one every 60/per_minute s."""
    interval = RATE_WINDOW_S / per_minute
    start = now if tat is None or tat < now else tat
    after = start + interval
    wait = after - now - RATE_WINDOW_S
    if wait > 1e-9:
        return (tat if tat is not None else now), wait
    return after, 0.0


def check_quota(
    job: NewJob, quota: Quota | None, *, in_flight: int, tat: float | None, now: float
) -> float | None:
    """Raise the limit error ``quota`` calls for, else return the tat to store (None: no rate
    limit). ``in_flight`` is the tenant's count of queued and processing jobs, ``now`` the
    submission time (the job's created_at)."""
    if quota is None:
        return None
    if quota.max_in_flight is not None and in_flight >= quota.max_in_flight:
        raise QuotaExceededError(job.tenant, quota.max_in_flight)
    if quota.per_minute is None:
        return None
    new_tat, wait = rate_check(tat, now, quota.per_minute)
    if wait > 0:
        raise SubmitRateLimitedError(job.tenant, quota.per_minute, retry_after=wait)
    return new_tat


@dataclass
class FairClocks:
    """Start-time fair queueing state: the virtual clock of each ready queue (a task type and
    priority) and each tenant's last tag in it (see ``Backend.claim``)."""

    clock: dict[tuple[str, int], int] = field(default_factory=dict)
    last: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def tag(self, tenant: str, type: str, priority: int, cost: int, *, waiting: bool) -> int:
        """The tag of a job joining ``tenant``'s line in the (type, priority) queue now;
        ``waiting``: whether a job of that queue waits already (has its tag, unclaimed)."""
        queue = (type, priority)
        if queue not in self.clock or not waiting:
            # A new queue, or one with no job waiting, starts level with the others at its
            # priority: a clock that stood still while the others moved on would put the
            # queue's next backlog ahead of every job of theirs (Backend.claim).
            self.clock[queue] = max(
                (c for (_, p), c in self.clock.items() if p == priority), default=0
            )
        start = max(self.last.get((tenant, type, priority), 0), self.clock[queue])
        self.last[tenant, type, priority] = start + cost
        return start + cost

    def withdrawn(self, tenant: str, type: str, priority: int, tag: int, cost: int) -> None:
        """A job of ``tenant`` waiting in line with ``tag`` was cancelled. The newest of its
        line: the line ends where it began (a backlog cancelled newest first, as a batch's
        is, leaves nothing to wait behind). An older one: nothing changes, so the tenant's
        next job still goes after its newer ones (FIFO)."""
        key = (tenant, type, priority)
        if self.last.get(key) == tag:
            self.last[key] = tag - cost

    def claimed(self, type: str, priority: int, tag: int) -> None:
        if tag > self.clock.get((type, priority), 0):
            self.clock[type, priority] = tag
