"""TTL expiry with a controllable clock: finished jobs and their events disappear on time."""

from __future__ import annotations

import pytest

from backburner import Backburner, JobContext, ManualClock, Settings
from backburner.backends import Backend
from backburner.errors import JobNotFoundError, QueueFullError
from backburner.models import JobStatus

from ..helpers import running_worker


async def test_finished_jobs_expire_after_their_ttl(backend: Backend, clock: ManualClock) -> None:
    bb = Backburner(backend, settings=Settings(backend_url="memory://"), clock=clock)

    @bb.task
    async def noop(ctx: JobContext) -> str:
        await ctx.emit("note", {"n": 1})
        return "done"

    short = await bb.enqueue("noop", ttl=60, idempotency_key="k")
    long = await bb.enqueue("noop", ttl=3600)
    async with running_worker(bb):
        assert (await bb.wait(short.task_id, timeout=20)).status == JobStatus.COMPLETED
        assert (await bb.wait(long.task_id, timeout=20)).status == JobStatus.COMPLETED
    done = await bb.get(short.task_id)
    assert done.expires_at == done.finished_at + 60  # type: ignore[operator]

    clock.advance(59)
    assert (await bb.sweep()).purged == 0
    assert (await bb.get(short.task_id)).result == "done"

    clock.advance(2)
    assert (await bb.sweep()).purged == 1
    with pytest.raises(JobNotFoundError):
        await bb.get(short.task_id)
    assert await backend.events(short.task_id) == []
    with pytest.raises(JobNotFoundError):
        await bb.events(short.task_id)
    assert (await bb.get(long.task_id)).status == JobStatus.COMPLETED
    # The key is free again once its job is gone.
    again = await bb.enqueue("noop", ttl=60, idempotency_key="k")
    assert again.task_id != short.task_id


async def test_queued_and_running_jobs_never_expire(backend: Backend, clock: ManualClock) -> None:
    bb = Backburner(backend, settings=Settings(backend_url="memory://"), clock=clock)

    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    job = await bb.enqueue("noop", ttl=1, delay=10_000)
    running = await bb.enqueue("noop", ttl=1)
    claimed = await backend.claim("w", limit=1, now=clock.now(), lease_s=1e6)
    assert [j.task_id for j in claimed] == [running.task_id]
    clock.advance(5_000)
    await bb.sweep()
    assert (await bb.get(job.task_id)).status == JobStatus.QUEUED
    assert (await bb.get(running.task_id)).status == JobStatus.PROCESSING


async def test_cancelled_jobs_expire_too(backend: Backend, clock: ManualClock) -> None:
    bb = Backburner(backend, settings=Settings(backend_url="memory://"), clock=clock)

    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    job = await bb.enqueue("noop", ttl=10, delay=100)
    await bb.cancel(job.task_id)
    clock.advance(11)
    await bb.sweep()
    with pytest.raises(JobNotFoundError):
        await bb.get(job.task_id)
    with pytest.raises(JobNotFoundError):
        await bb.cancel(job.task_id)
    with pytest.raises(JobNotFoundError):
        await bb.delete(job.task_id)


async def test_delete_frees_a_full_queue_only_for_terminal_jobs(
    backend: Backend, clock: ManualClock
) -> None:
    bb = Backburner(backend, settings=Settings(backend_url="memory://"), clock=clock)
    backend.max_queue_size = 1  # type: ignore[attr-defined]

    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    first = await bb.enqueue("noop")
    with pytest.raises(QueueFullError):
        await bb.enqueue("noop")
    await bb.cancel(first.task_id)
    await bb.delete(first.task_id)
    second = await bb.enqueue("noop")
    assert second.status == JobStatus.QUEUED
