"""wait_for_jobs: at once when work is due, woken by new work, bounded by its timeout.

wait_for_jobs measures its waits in real seconds, so these tests use short real waits and
assert with generous margins: a missed wake-up shows as a 30 s wait cut off at 5 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from backburner.backends import Backend
from backburner.backends.base import Release, RetryAt
from backburner.models import JobStatus

from ._support import T0, drive, enqueue, error, opened, peer

LONG = 30.0
"""The timeout passed to waits that should end early."""
PATIENCE = 5.0
"""How long a test lets such a wait run before calling the wake-up missed."""


async def _parked(backend: Backend, *, now: float = T0) -> asyncio.Task[None]:
    """A wait_for_jobs(timeout=LONG) that is really waiting (retrying spurious wake-ups)."""
    for _ in range(5):
        task = asyncio.create_task(backend.wait_for_jobs(now=now, timeout=LONG))
        await asyncio.sleep(0.05)
        if not task.done():
            return task
        await task  # a spurious wake-up is allowed; look again
    pytest.fail("wait_for_jobs with nothing to do never waits")


async def _finishes_soon(task: asyncio.Task[None]) -> float:
    started = time.monotonic()
    try:
        await asyncio.wait_for(task, PATIENCE)
    except TimeoutError:
        pytest.fail(f"wait_for_jobs(timeout={LONG}) was not woken within {PATIENCE} s")
    return time.monotonic() - started


async def test_returns_at_once_when_a_job_is_due(backend: Backend) -> None:
    await enqueue(backend, now=T0)
    started = time.monotonic()
    await asyncio.wait_for(backend.wait_for_jobs(now=T0, timeout=LONG), PATIENCE)
    assert time.monotonic() - started < 1.0


async def test_returns_at_once_when_a_delayed_job_has_become_due(backend: Backend) -> None:
    await enqueue(backend, now=T0, run_at=T0 + 60)
    started = time.monotonic()
    await asyncio.wait_for(backend.wait_for_jobs(now=T0 + 60, timeout=LONG), PATIENCE)
    assert time.monotonic() - started < 1.0


async def test_waits_at_most_until_the_next_delayed_job(backend: Backend) -> None:
    await enqueue(backend, now=T0, run_at=T0 + 0.3)
    started = time.monotonic()
    await asyncio.wait_for(backend.wait_for_jobs(now=T0, timeout=LONG), PATIENCE)
    assert time.monotonic() - started < PATIENCE


async def test_returns_by_the_timeout_when_nothing_comes(backend: Backend) -> None:
    await backend.wait_for_jobs(now=T0, timeout=0.01)  # settle any first-call wake-up
    started = time.monotonic()
    await asyncio.wait_for(backend.wait_for_jobs(now=T0, timeout=0.2), PATIENCE)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0
    # A job due long after the timeout does not stretch the wait either.
    await enqueue(backend, now=T0, run_at=T0 + 3600)
    started = time.monotonic()
    await asyncio.wait_for(backend.wait_for_jobs(now=T0, timeout=0.2), PATIENCE)
    assert time.monotonic() - started < 2.0


async def test_jobs_that_are_not_queued_do_not_count_as_due(backend: Backend) -> None:
    await drive(backend, JobStatus.PROCESSING)
    await drive(backend, JobStatus.COMPLETED)
    await drive(backend, JobStatus.CANCELLED)
    task = await _parked(backend, now=T0 + 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _enqueue_here(backend: Backend, other: Backend) -> None:
    await enqueue(backend, now=T0)


async def _enqueue_elsewhere(backend: Backend, other: Backend) -> None:
    await enqueue(other, now=T0)


async def _enqueue_delayed_then_due(backend: Backend, other: Backend) -> None:
    await enqueue(other, now=T0, run_at=T0 + 0.2)


WAKERS: dict[str, Callable[[Backend, Backend], Awaitable[None]]] = {
    "enqueue": _enqueue_here,
    "enqueue-from-another-connection": _enqueue_elsewhere,
    "enqueue-delayed": _enqueue_delayed_then_due,
}


@pytest.mark.parametrize("how", list(WAKERS))
async def test_an_enqueue_wakes_a_waiter(backend: Backend, how: str) -> None:
    async with peer(backend) as other:
        await backend.wait_for_jobs(now=T0, timeout=0.01)  # settle any first-call wake-up
        task = await _parked(backend)
        started = time.monotonic()
        await WAKERS[how](backend, other)
        await _finishes_soon(task)
        assert time.monotonic() - started < PATIENCE


@pytest.mark.parametrize("outcome", ["release", "retry-now"])
async def test_a_requeued_job_wakes_a_waiter(backend: Backend, outcome: str) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    async with peer(backend) as other:
        task = await _parked(other, now=T0 + 5)
        if outcome == "release":
            await backend.finish(job.task_id, job.fence, Release(), now=T0 + 5)
        else:
            await backend.finish(job.task_id, job.fence, RetryAt(error(), T0 + 5), now=T0 + 5)
        await _finishes_soon(task)
        assert await other.claim("w2", limit=1, now=T0 + 5, lease_s=30) != []


async def test_a_replay_wakes_a_waiter(backend: Backend) -> None:
    failed = await drive(backend, JobStatus.FAILED)
    task = await _parked(backend, now=T0 + 10)
    await backend.replay(failed.task_id, now=T0 + 10, extra_attempts=1)
    await _finishes_soon(task)


async def test_many_waiters_are_all_woken(backend: Backend) -> None:
    await backend.wait_for_jobs(now=T0, timeout=0.01)
    tasks = [await _parked(backend) for _ in range(5)]
    await enqueue(backend, now=T0)
    await asyncio.wait_for(asyncio.gather(*tasks), PATIENCE)


async def test_due_jobs_of_other_types_do_not_count(backend: Backend) -> None:
    await enqueue(backend, "other", now=T0)
    waiting = asyncio.create_task(backend.wait_for_jobs(now=T0, timeout=0.3, types=["mine"]))
    started = time.monotonic()
    await asyncio.wait_for(waiting, PATIENCE)
    assert time.monotonic() - started >= 0.25  # it waited: nothing of its type was due
    await enqueue(backend, "mine", now=T0)
    started = time.monotonic()
    await asyncio.wait_for(backend.wait_for_jobs(now=T0, timeout=LONG, types=["mine"]), PATIENCE)
    assert time.monotonic() - started < 1.0


async def test_commits_that_add_no_work_do_not_end_the_wait(backend: Backend) -> None:
    """Events and heartbeats from elsewhere must not turn idle workers into busy claimers."""
    job = await drive(backend, JobStatus.PROCESSING)
    async with peer(backend) as other:
        waiting = asyncio.create_task(backend.wait_for_jobs(now=T0, timeout=0.5))
        for i in range(20):
            await other.append_event(job.task_id, job.fence, "token", {"i": i}, now=T0)
            await other.heartbeat("w1", {job.task_id: job.fence}, now=T0, lease_s=60)
        started = time.monotonic()
        await asyncio.wait_for(waiting, PATIENCE)
        assert waiting.done()
    assert time.monotonic() - started >= 0.0
    # It ended by its timeout, not by those commits: a fresh wait still waits.
    again = asyncio.create_task(backend.wait_for_jobs(now=T0, timeout=0.3))
    begun = time.monotonic()
    await asyncio.wait_for(again, PATIENCE)
    assert time.monotonic() - begun >= 0.25


# -- wait_for_events --------------------------------------------------------------------------


async def test_wait_for_events_returns_at_once_for_logs_already_past(backend: Backend) -> None:
    job = await enqueue(backend)  # one event: seq 1
    other = await enqueue(backend)
    heads = await asyncio.wait_for(
        backend.wait_for_events({job.task_id: 0, other.task_id: 1}, timeout=LONG), PATIENCE
    )
    assert heads == {job.task_id: 1}


async def test_wait_for_events_times_out_empty(backend: Backend) -> None:
    job = await enqueue(backend)
    started = time.monotonic()
    assert await backend.wait_for_events({job.task_id: 1}, timeout=0.3) == {}
    assert time.monotonic() - started >= 0.25


async def test_wait_for_events_reports_missing_jobs(backend: Backend) -> None:
    assert await backend.wait_for_events({"task_missing": 3}, timeout=LONG) == {"task_missing": 0}


@pytest.mark.parametrize("writer", ["same", "peer"])
async def test_an_appended_event_wakes_the_events_waiter(backend: Backend, writer: str) -> None:
    job = await drive(backend, JobStatus.PROCESSING)  # events 1 (queued) and 2 (processing)
    quiet = await enqueue(backend)
    async with peer(backend) as other:
        source = backend if writer == "same" else other
        waiting = asyncio.create_task(
            backend.wait_for_events({job.task_id: 2, quiet.task_id: 1}, timeout=LONG)
        )
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await source.append_event(job.task_id, job.fence, "token", {"t": "hi"}, now=T0)
        await _finishes_soon(waiting)
    assert waiting.result() == {job.task_id: 3}


async def test_waits_cancelled_and_restarted_for_more_jobs_still_wake_at_once(
    backend: Backend,
) -> None:
    """The pattern of an API process's event hub: every new stream cancels the wait and
    starts one that covers one more job. The last wait must hear the newest job at once."""
    jobs = [await drive(backend, JobStatus.PROCESSING) for _ in range(6)]
    after: dict[str, int] = {}
    for job in jobs:
        after[job.task_id] = 2
        waiting = asyncio.create_task(backend.wait_for_events(dict(after), timeout=LONG))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    waiting = asyncio.create_task(backend.wait_for_events(dict(after), timeout=LONG))
    await asyncio.sleep(0.05)
    newest = jobs[-1]
    await backend.append_event(newest.task_id, newest.fence, "token", {"t": "hi"}, now=T0)
    assert await _finishes_soon(waiting) < 1.0
    assert waiting.result() == {newest.task_id: 3}


@pytest.mark.slow
async def test_a_wait_longer_than_a_network_timeout_still_wakes(backend: Backend) -> None:
    """Nothing happens for 6 s (longer than a 5 s socket timeout), then an event comes."""
    job = await drive(backend, JobStatus.PROCESSING)
    waiting = asyncio.create_task(backend.wait_for_events({job.task_id: 2}, timeout=LONG))
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        assert not waiting.done(), waiting.result()  # nothing new yet: it must keep waiting
    await backend.append_event(job.task_id, job.fence, "token", {"t": "late"}, now=T0)
    assert await _finishes_soon(waiting) < 1.0
    assert waiting.result() == {job.task_id: 3}


@pytest.mark.slow
async def test_a_job_wait_longer_than_a_network_timeout_still_wakes(backend: Backend) -> None:
    waiting = await _parked(backend)
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        assert not waiting.done()
    await enqueue(backend, now=T0)
    assert await _finishes_soon(waiting) < 1.0


async def test_close_returns_promptly_after_waits_of_both_kinds(
    backend_kind: str, tmp_path: Path
) -> None:
    """A worker process must be able to exit: closing never hangs on a wait's machinery."""
    for round_ in range(10):
        async with opened(backend_kind, tmp_path / str(round_)) as engine:
            job = await drive(engine, JobStatus.PROCESSING)
            waits = [
                asyncio.create_task(engine.wait_for_jobs(now=T0, timeout=LONG, types=["x"])),
                asyncio.create_task(engine.wait_for_events({job.task_id: 2}, timeout=LONG)),
            ]
            await asyncio.sleep(0.01 * round_)
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            started = time.monotonic()
            await asyncio.wait_for(engine.close(), PATIENCE)
            assert time.monotonic() - started < 2.0
