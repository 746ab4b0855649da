"""An in-memory backend for tests and demos: one process, nothing survives a restart.

Each method runs without awaiting in the middle, so on one event loop every transition is
atomic. It implements exactly the contract of ``Backend`` and passes the conformance suite.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from ..errors import (
    BackendError,
    IdempotencyConflictError,
    InvalidTransitionError,
    JobNotFoundError,
    LeaseLostError,
    QueueFullError,
    QuotaExceededError,
)
from ..jsoncodec import check_usage, round_trip
from ..models import (
    AttemptRecord,
    ErrorInfo,
    Event,
    Job,
    JobStatus,
    Progress,
    Usage,
)
from .admission import FairClocks, check_quota
from .base import (
    CHILD_KEEP_S,
    WORKER_RETENTION_S,
    Complete,
    Fail,
    NewJob,
    NextClaim,
    Outcome,
    Page,
    Quota,
    Release,
    RetryAt,
    Stats,
    Wait,
    WorkerInfo,
    parse_cursor,
    replayable,
)
from .memory_outbox import MemoryOutbox, MemoryWebhooks
from .memory_slots import MemorySlots


def _json_copy(value: Any) -> Any:
    """Store what SQLite would: a JSON round trip, refusing what JSON cannot hold."""
    return round_trip(value, "data")


M = TypeVar("M", bound=BaseModel)


def _copy(model: M) -> M:
    """Hand out copies, as a real store would: a caller's mutation must not reach the store."""
    return model.model_copy(deep=True)


@dataclass
class _Stored:
    seq: int
    fingerprint: str
    job: Job
    cost: int
    tag: int | None = None
    """Its fair-share tag while it waits in its tenant's line (None: not in line yet)."""
    events: list[Event] = field(default_factory=list)


class MemoryBackend(MemorySlots, MemoryWebhooks):
    """Backend held in this process's memory (``memory://``). For tests and demos only."""

    def __init__(self, *, max_queue_size: int | None = None) -> None:
        self.max_queue_size = max_queue_size
        self._jobs: dict[str, _Stored] = {}
        self._by_key: dict[str, str] = {}
        self._signals: dict[str, dict[str, int]] = {}
        self._workers: dict[str, WorkerInfo] = {}
        self._seq = itertools.count(1)
        self._waiters: set[asyncio.Future[None]] = set()
        self._slots: dict[str, dict[str, float]] = {}
        """Slot key -> {holder: expires_at}; a key with no holders left is dropped."""
        self._outbox = MemoryOutbox()
        self._fair = FairClocks()
        self._rates: dict[str, float] = {}
        """Tenant -> its submission bucket's theoretical arrival time (GCRA)."""

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        self._wake()

    # -- helpers -----------------------------------------------------------------------------

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def _update(self, stored: _Stored, **changes: Any) -> Job:
        stored.job = stored.job.model_copy(update=changes)
        return stored.job

    def _event(self, stored: _Stored, type: str, data: Any, at: float) -> int:
        seq = len(stored.events) + 1
        stored.events.append(
            Event.model_construct(task_id=stored.job.task_id, seq=seq, type=type, data=data, at=at)
        )
        self._wake()
        return seq

    def _held(self, task_id: str, fence: int) -> _Stored:
        stored = self._jobs.get(task_id)
        if stored is None or stored.job.fence != fence or stored.job.status != "processing":
            raise LeaseLostError(task_id, fence)
        return stored

    @staticmethod
    def _close_history(job: Job, now: float, outcome: str, error: ErrorInfo | None) -> list[Any]:
        history = list(job.history)
        if history:
            history[-1] = history[-1].model_copy(
                update={"finished_at": now, "outcome": outcome, "error": error}
            )
        return history

    def _count(self, status: JobStatus) -> int:
        return sum(1 for s in self._jobs.values() if s.job.status == status)

    # -- producers ---------------------------------------------------------------------------

    async def enqueue(self, job: NewJob, *, quota: Quota | None = None) -> tuple[Job, bool]:
        if job.task_id in self._jobs:
            raise BackendError(f"a job with id {job.task_id} already exists")
        if job.idempotency_key is not None and job.idempotency_key in self._by_key:
            existing = self._jobs[self._by_key[job.idempotency_key]]
            if existing.job.tenant != job.tenant:
                raise IdempotencyConflictError(job.idempotency_key, "")
            if existing.fingerprint != job.fingerprint:
                raise IdempotencyConflictError(job.idempotency_key, existing.job.task_id)
            return _copy(existing.job), False
        if self.max_queue_size is not None:
            queued = self._count(JobStatus.QUEUED)
            if queued >= self.max_queue_size:
                raise QueueFullError(
                    f"the queue holds {queued} jobs, its limit (max_queue_size) is "
                    f"{self.max_queue_size}"
                )
        tat = check_quota(
            job,
            quota,
            in_flight=self._in_flight(job.tenant),
            tat=self._rates.get(job.tenant),
            now=job.created_at,
        )
        stored = _Stored(
            seq=next(self._seq),
            fingerprint=job.fingerprint,
            job=job.to_job(input=_json_copy(job.input), metadata=_json_copy(job.metadata)),
            cost=job.fair_cost,
        )
        if tat is not None:
            self._rates[job.tenant] = tat
        if job.run_at <= job.created_at:
            stored.tag = self._tag(stored)
        self._jobs[job.task_id] = stored
        if job.idempotency_key is not None:
            self._by_key[job.idempotency_key] = job.task_id
        self._event(stored, "status", {"status": "queued"}, job.created_at)
        self._wake()
        return _copy(stored.job), True

    # -- reads -------------------------------------------------------------------------------

    async def get(self, task_id: str) -> Job | None:
        stored = self._jobs.get(task_id)
        return None if stored is None else _copy(stored.job)

    async def job_status(self, task_id: str) -> JobStatus | None:
        stored = self._jobs.get(task_id)
        return None if stored is None else stored.job.status

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        tenant: str | None = None,
        parent_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        below = parse_cursor(cursor)
        matches = sorted(
            (
                s
                for s in self._jobs.values()
                if (status is None or s.job.status == status)
                and (type is None or s.job.type == type)
                and (tenant is None or s.job.tenant == tenant)
                and (parent_id is None or s.job.parent_id == parent_id)
                and (below is None or s.seq < below)
            ),
            key=lambda s: -s.seq,
        )
        page = matches[:limit]
        more = len(matches) > limit
        return Page([_copy(s.job) for s in page], str(page[-1].seq) if more and page else None)

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        stored = self._jobs.get(task_id)
        if stored is None:
            return []
        return [_copy(e) for e in stored.events if e.seq > after][: max(limit, 0)]

    # -- workers -----------------------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        *,
        limit: int,
        now: float,
        lease_s: float,
        types: Sequence[str] | None = None,
    ) -> list[Job]:
        if limit <= 0:
            return []
        self._join_lines(now)
        due = [
            (-s.job.priority, s.tag, s.seq, s)
            for s in self._jobs.values()
            if s.job.status == JobStatus.QUEUED
            and s.tag is not None
            and s.job.run_at <= now
            and (types is None or s.job.type in types)
        ]
        claimed: list[Job] = []
        for *_, stored in heapq.nsmallest(limit, due, key=lambda item: item[:3]):
            job = stored.job
            assert stored.tag is not None
            self._fair.claimed(job.type, job.priority, stored.tag)
            record = AttemptRecord(attempt=job.attempts + 1, worker_id=worker_id, started_at=now)
            self._update(
                stored,
                status=JobStatus.PROCESSING,
                attempts=job.attempts + 1,
                fence=job.fence + 1,
                worker_id=worker_id,
                lease_expires_at=now + lease_s,
                started_at=now,
                history=[*job.history, record],
            )
            self._event(
                stored,
                "status",
                {"status": "processing", "attempt": job.attempts + 1, "worker_id": worker_id},
                now,
            )
            claimed.append(_copy(stored.job))
        return claimed

    def _join_lines(self, now: float) -> None:
        """Give the jobs that became due since they were queued their fair-share tags."""
        due = sorted(
            (s.job.run_at, s.seq, s)
            for s in self._jobs.values()
            if s.job.status == JobStatus.QUEUED and s.tag is None and s.job.run_at <= now
        )
        for *_, stored in due:
            stored.tag = self._tag(stored)

    def _tag(self, stored: _Stored) -> int:
        """The fair-share tag of ``stored`` joining its tenant's line now."""
        job = stored.job
        waiting = any(
            s is not stored
            and s.tag is not None
            and s.job.status == JobStatus.QUEUED
            and s.job.type == job.type
            and s.job.priority == job.priority
            for s in self._jobs.values()
        )
        return self._fair.tag(job.tenant, job.type, job.priority, stored.cost, waiting=waiting)

    def _in_flight(self, tenant: str) -> int:
        return sum(
            1
            for s in self._jobs.values()
            if s.job.tenant == tenant
            and s.job.parent_id is None  # a pipeline's children are its work, not submissions
            and s.job.status in (JobStatus.QUEUED, JobStatus.PROCESSING)
        )

    async def tenant_in_flight(self, tenant: str) -> int:
        return self._in_flight(tenant)

    async def wake(self, task_id: str, *, now: float) -> bool:
        stored = self._jobs.get(task_id)
        if stored is None or stored.job.status != JobStatus.QUEUED or stored.job.run_at <= now:
            return False
        self._update(stored, run_at=now)
        stored.tag = self._tag(stored)
        self._wake()
        return True

    async def has_open_children(self, parent_id: str) -> bool:
        return any(
            s.job.parent_id == parent_id
            and s.job.status in (JobStatus.QUEUED, JobStatus.PROCESSING)
            for s in self._jobs.values()
        )

    async def heartbeat(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lease_s: float
    ) -> dict[str, int]:
        renewed: dict[str, int] = {}
        for task_id, fence in held.items():
            stored = self._jobs.get(task_id)
            if stored is None:
                continue
            job = stored.job
            if (job.status, job.fence, job.worker_id) == (JobStatus.PROCESSING, fence, worker_id):
                self._update(stored, lease_expires_at=now + lease_s)
                renewed[task_id] = fence
        previous = self._workers.get(worker_id)
        self._workers[worker_id] = WorkerInfo(
            worker_id=worker_id,
            last_seen=now,
            running=len(held),
            started_at=previous.started_at if previous else now,
        )
        return renewed

    async def append_event(
        self,
        task_id: str,
        fence: int,
        type: str,
        data: Any,
        *,
        now: float,
        progress: Progress | None = None,
    ) -> int:
        stored = self._held(task_id, fence)
        data = _json_copy(data)
        if progress is not None:
            self._update(stored, progress=progress)
        return self._event(stored, type, data, now)

    async def finish(
        self,
        task_id: str,
        fence: int,
        outcome: Outcome,
        *,
        now: float,
        only_if_lease_expired: bool = False,
        claimed: Job | None = None,
        then_claim: NextClaim | None = None,
    ) -> Job:
        stored = self._held(task_id, fence)
        job = stored.job
        if only_if_lease_expired and (job.lease_expires_at or 0) > now:
            raise LeaseLostError(task_id, fence)
        if isinstance(outcome, Complete):
            result = _json_copy(outcome.result)
            usage = check_usage(outcome.usage)
            self._update(
                stored,
                status=JobStatus.COMPLETED,
                result=result,
                usage=Usage(**usage) if usage is not None else job.usage,
                error=None,
                finished_at=now,
                expires_at=now + job.ttl_s,
                lease_expires_at=None,
                progress=Progress(percent=100, message=job.progress.message),
                history=self._close_history(job, now, "completed", None),
            )
            self._event(stored, "status", {"status": "completed", "result": result}, now)
            self._outbox.write(stored.job, now)
        elif isinstance(outcome, Fail):
            error = outcome.error.model_dump()
            self._update(
                stored,
                status=JobStatus.FAILED,
                error=outcome.error,
                finished_at=now,
                expires_at=now + outcome.ttl_s,
                lease_expires_at=None,
                history=self._close_history(job, now, "failed", outcome.error),
            )
            self._event(stored, "attempt_failed", {"error": error, "attempt": job.attempts}, now)
            self._event(stored, "status", {"status": "failed", "error": error}, now)
            self._outbox.write(stored.job, now)
        elif isinstance(outcome, RetryAt):
            error = outcome.error.model_dump()
            stored.tag = None
            if outcome.run_at <= now:
                stored.tag = self._tag(stored)
            self._update(
                stored,
                status=JobStatus.QUEUED,
                error=outcome.error,
                run_at=outcome.run_at,
                worker_id=None,
                lease_expires_at=None,
                history=self._close_history(job, now, "retry", outcome.error),
            )
            self._event(
                stored,
                "attempt_failed",
                {"error": error, "retry_at": outcome.run_at, "attempt": job.attempts},
                now,
            )
            self._event(stored, "status", {"status": "queued"}, now)
            self._wake()
        elif isinstance(outcome, Wait):
            stored.tag = None
            if outcome.run_at <= now:
                stored.tag = self._tag(stored)
            self._update(
                stored,
                status=JobStatus.QUEUED,
                attempts=job.attempts - 1,
                run_at=outcome.run_at,
                worker_id=None,
                lease_expires_at=None,
                usage=_usage_after(outcome.usage, job.usage),
                history=self._close_history(job, now, "waiting", None),
            )
            self._event(stored, "status", {"status": "queued", "waiting": outcome.reason}, now)
        elif isinstance(outcome, Release):
            self._update(
                stored,
                status=JobStatus.QUEUED,
                attempts=job.attempts - 1,
                run_at=now,
                worker_id=None,
                lease_expires_at=None,
                usage=_usage_after(outcome.usage, job.usage),
                history=self._close_history(job, now, "released", None),
            )
            self._event(stored, "status", {"status": "queued", "released": outcome.reason}, now)
            self._wake()
        return _copy(stored.job)

    async def cancel(self, task_id: str, *, now: float) -> tuple[Job, bool]:
        stored = self._jobs.get(task_id)
        if stored is None:
            raise JobNotFoundError(task_id)
        job = stored.job
        if job.is_terminal:
            return _copy(job), False
        history = job.history
        if job.status == JobStatus.QUEUED and stored.tag is not None:
            self._fair.withdrawn(job.tenant, job.type, job.priority, stored.tag, stored.cost)
        if job.status == JobStatus.PROCESSING:
            history = self._close_history(job, now, "cancelled", None)
            assert job.worker_id is not None
            self._signals.setdefault(job.worker_id, {})[task_id] = job.fence
        self._update(
            stored,
            status=JobStatus.CANCELLED,
            finished_at=now,
            expires_at=now + job.ttl_s,
            lease_expires_at=None,
            history=history,
        )
        self._event(stored, "status", {"status": "cancelled"}, now)
        self._outbox.write(stored.job, now)
        return _copy(stored.job), True

    async def poll_cancellations(self, worker_id: str) -> dict[str, int]:
        return self._signals.pop(worker_id, {})

    # -- admin -------------------------------------------------------------------------------

    async def replay(
        self,
        task_id: str,
        *,
        now: float,
        extra_attempts: int,
        quota: Quota | None = None,
        cancelled_too: bool = False,
    ) -> Job:
        stored = self._jobs.get(task_id)
        if stored is None:
            raise JobNotFoundError(task_id)
        job = stored.job
        if not replayable(job.status, cancelled_too):
            raise InvalidTransitionError(
                f"only failed jobs can be replayed; job {task_id} is {job.status}"
            )
        limit = None if quota is None else quota.max_in_flight
        if limit is not None and job.parent_id is None and self._in_flight(job.tenant) >= limit:
            raise QuotaExceededError(job.tenant, limit)
        stored.tag = self._tag(stored)  # due now
        self._update(
            stored,
            status=JobStatus.QUEUED,
            max_attempts=job.attempts + extra_attempts,
            run_at=now,
            deadline_at=None if job.deadline_at is None else now + job.deadline_at - job.created_at,
            finished_at=None,
            expires_at=None,
            error=None,
            worker_id=None,
        )
        self._event(stored, "status", {"status": "queued", "replayed": True}, now)
        self._wake()
        return _copy(stored.job)

    async def delete(self, task_id: str) -> bool:
        stored = self._jobs.get(task_id)
        if stored is None:
            return False
        if not stored.job.is_terminal:
            raise InvalidTransitionError(
                f"job {task_id} is {stored.job.status}; only terminal jobs can be deleted"
                " (cancel it first)"
            )
        self._remove(stored)
        return True

    def _remove(self, stored: _Stored) -> None:
        del self._jobs[stored.job.task_id]
        self._outbox.drop(stored.job.task_id)
        self._wake()
        key = stored.job.idempotency_key
        if key is not None and self._by_key.get(key) == stored.job.task_id:
            del self._by_key[key]

    # -- sweeper -----------------------------------------------------------------------------

    async def expired_leases(self, *, now: float, limit: int) -> list[Job]:
        expired = [
            s.job
            for s in self._jobs.values()
            if s.job.status == JobStatus.PROCESSING and (s.job.lease_expires_at or 0) <= now
        ]
        expired.sort(key=lambda j: j.lease_expires_at or 0)
        return [_copy(j) for j in expired[:limit]]

    async def purge_expired(self, *, now: float, limit: int) -> int:
        doomed = [
            s
            for s in self._jobs.values()
            if s.job.expires_at is not None and s.job.expires_at <= now
        ][:limit]
        purged = 0
        for stored in doomed:
            parent = self._jobs.get(stored.job.parent_id or "")
            if parent is not None:
                keep = parent.job.expires_at or now + CHILD_KEEP_S
                if keep > now:  # kept while its parent is (CHILD_KEEP_S)
                    self._update(stored, expires_at=keep)
                    continue
            self._remove(stored)
            purged += 1
        gone = [w for w, info in self._workers.items() if info.last_seen < now - WORKER_RETENTION_S]
        for worker_id in gone:
            del self._workers[worker_id]
        return purged

    async def wait_for_jobs(
        self,
        *,
        now: float,
        timeout: float,
        types: Sequence[str] | None = None,
        worker_id: str | None = None,
        lease_s: float = 30.0,
        on_handed: Callable[[Job], None] | None = None,
    ) -> list[Job]:
        await self._wait_for_jobs(now, timeout, types)
        return []  # no hand-off: one process, a claim costs no round trip

    async def stop_waiting(self, worker_id: str) -> list[Job]:
        return []

    async def _wait_for_jobs(self, now: float, timeout: float, types: Sequence[str] | None) -> None:
        queued = [
            s.job.run_at
            for s in self._jobs.values()
            if s.job.status == JobStatus.QUEUED and (types is None or s.job.type in types)
        ]
        next_due = min(queued, default=None)
        if next_due is not None and next_due <= now:
            return
        wait = timeout if next_due is None else min(timeout, next_due - now)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait({waiter}, timeout=wait)
        finally:
            self._waiters.discard(waiter)

    async def wait_for_events(self, after: Mapping[str, int], *, timeout: float) -> dict[str, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            grown: dict[str, int] = {}
            for task_id, seq in after.items():
                stored = self._jobs.get(task_id)
                head = 0 if stored is None else len(stored.events)
                if stored is None or head > seq:
                    grown[task_id] = head
            left = deadline - loop.time()
            if grown or left <= 0:
                return grown
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait({waiter}, timeout=left)
            finally:
                self._waiters.discard(waiter)

    async def stats(self, *, now: float, worker_window_s: float = 60.0) -> Stats:
        counts = {status: 0 for status in JobStatus}
        by_priority: dict[int, int] = {}
        due = 0
        for stored in self._jobs.values():
            counts[stored.job.status] += 1
            if stored.job.status == JobStatus.QUEUED:
                by_priority[stored.job.priority] = by_priority.get(stored.job.priority, 0) + 1
                due += stored.job.run_at <= now
        workers = sorted(
            (w for w in self._workers.values() if w.last_seen >= now - worker_window_s),
            key=lambda w: w.worker_id,
        )
        return Stats(
            counts,
            dict(sorted(by_priority.items(), reverse=True)),
            counts[JobStatus.FAILED],
            workers,
            due,
        )


def _usage_after(usage: dict[str, Any] | None, kept: Usage | None) -> Usage | None:
    """A Wait's or a Release's usage as stored: None leaves it, {} clears it (Wait.usage)."""
    if usage is None:
        return kept
    checked = check_usage(usage)
    return Usage(**checked) if checked else None
