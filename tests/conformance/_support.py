"""Helpers shared by the conformance tests: job builders, state drivers, second connections."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, NewJob, fingerprint, new_task_id
from backburner.backends.redis import RedisBackend
from backburner.backends.sqlite import SQLiteBackend
from backburner.models import ErrorInfo, Job, JobStatus
from tests.conftest import drop_redis_keys, make_backend

T0 = 1000.0
"""The fixed "now" of most tests (backends never read the wall clock)."""
LEASE = 30.0
TTL = 3600.0

_DEFAULT_PAYLOAD: dict[str, Any] = {"text": "hello"}
_UNSET: Any = object()


def new_job(
    task_type: str = "summarize",
    payload: Any = _UNSET,
    *,
    now: float = T0,
    run_at: float | None = None,
    priority: int = 0,
    max_attempts: int = 3,
    ttl_s: float = TTL,
    idempotency_key: str | None = None,
    fp: str | None = None,
    **extra: Any,
) -> NewJob:
    """A NewJob created at ``now`` (due at ``now`` unless ``run_at``), with a fresh task id."""
    data = dict(_DEFAULT_PAYLOAD) if payload is _UNSET else payload
    return NewJob(
        task_id=new_task_id(),
        type=task_type,
        input=data,
        fingerprint=fingerprint(task_type, data) if fp is None else fp,
        created_at=now,
        run_at=now if run_at is None else run_at,
        priority=priority,
        max_attempts=max_attempts,
        ttl_s=ttl_s,
        idempotency_key=idempotency_key,
        **extra,
    )


async def enqueue(backend: Backend, *args: Any, **kwargs: Any) -> Job:
    """Enqueue a new job and check that it was created."""
    job, created = await backend.enqueue(new_job(*args, **kwargs))
    assert created is True
    return job


async def claim_one(
    backend: Backend,
    expected: str | None = None,
    *,
    worker: str = "w1",
    now: float = T0,
    lease_s: float = LEASE,
) -> Job:
    """Claim exactly one job (the ``expected`` one, if given)."""
    jobs = await backend.claim(worker, limit=1, now=now, lease_s=lease_s)
    assert len(jobs) == 1, jobs
    if expected is not None:
        assert jobs[0].task_id == expected
    return jobs[0]


def error(kind: str = "boom", message: str = "it broke", *, retryable: bool = True) -> ErrorInfo:
    return ErrorInfo(type=kind, message=message, retryable=retryable)


async def drive(
    backend: Backend,
    status: JobStatus | str,
    *,
    now: float = T0,
    worker: str = "w1",
    **kwargs: Any,
) -> Job:
    """A new job brought to ``status``: enqueued at now, claimed at now+1, finished at now+2.

    The job must be the next one claim() picks, so call it before enqueuing other due jobs.
    """
    status = JobStatus(status)
    job = await enqueue(backend, now=now, **kwargs)
    if status == JobStatus.QUEUED:
        return job
    if status == JobStatus.CANCELLED:
        cancelled, changed = await backend.cancel(job.task_id, now=now + 1)
        assert changed is True
        return cancelled
    claimed = await claim_one(backend, job.task_id, worker=worker, now=now + 1)
    if status == JobStatus.PROCESSING:
        return claimed
    if status == JobStatus.COMPLETED:
        outcome: Complete | Fail = Complete(result={"answer": 42})
    else:
        outcome = Fail(error(retryable=False), ttl_s=TTL)
    return await backend.finish(job.task_id, claimed.fence, outcome, now=now + 2)


async def snapshot(backend: Backend, task_id: str) -> tuple[dict[str, Any] | None, list[Any]]:
    """Everything stored about a job, to check that a refused call changed nothing."""
    job = await backend.get(task_id)
    events = await backend.events(task_id)
    return (None if job is None else job.model_dump(), [e.model_dump() for e in events])


async def event_data(backend: Backend, task_id: str, *, after: int = 0) -> list[tuple[str, Any]]:
    return [(e.type, e.data) for e in await backend.events(task_id, after=after)]


@asynccontextmanager
async def peer(backend: Backend) -> AsyncIterator[Backend]:
    """A second connection to the same store, as another process would open it.

    For SQLite a second ``SQLiteBackend`` on the same file (its own connection and writer
    thread); the in-process memory backend cannot be shared, so it is its own peer.
    """
    if isinstance(backend, SQLiteBackend):
        other = SQLiteBackend(backend.path, max_queue_size=backend.max_queue_size)
        await other.connect()
        try:
            yield other
        finally:
            await other.close()
    elif isinstance(backend, RedisBackend):
        other = RedisBackend(
            backend.url, prefix=backend.prefix, max_queue_size=backend.max_queue_size
        )
        await other.connect()
        try:
            yield other
        finally:
            await other.close()
    else:
        yield backend


@asynccontextmanager
async def opened(kind: str, directory: Path, **options: int | None) -> AsyncIterator[Backend]:
    """A connected backend of ``kind`` in its own directory, with constructor options."""
    directory.mkdir(parents=True, exist_ok=True)
    engine = make_backend(kind, directory, **options)
    await engine.connect()
    try:
        yield engine
    finally:
        await engine.close()
        await drop_redis_keys(engine)
