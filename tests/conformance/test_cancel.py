"""cancel, cancellation signals, and the finality of terminal states."""

from __future__ import annotations

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, Release, RetryAt
from backburner.errors import JobNotFoundError, LeaseLostError
from backburner.models import JobStatus, Progress

from ._support import LEASE, T0, TTL, claim_one, drive, enqueue, error, event_data, snapshot

TERMINAL = [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED]


@pytest.mark.parametrize("status", TERMINAL)
async def test_terminal_states_are_final(backend: Backend, status: JobStatus) -> None:
    job = await drive(backend, status)
    before = await snapshot(backend, job.task_id)
    # Never claimed again, however late.
    assert await backend.claim("w2", limit=10, now=T0 + 1e6, lease_s=LEASE) == []
    # No worker write gets in, whatever the fence.
    outcomes = [Complete(result=1), Fail(error(), ttl_s=TTL), RetryAt(error(), T0), Release()]
    for fence in {0, 1, 2, job.fence}:
        for outcome in outcomes:
            for guard in (False, True):
                with pytest.raises(LeaseLostError):
                    await backend.finish(
                        job.task_id, fence, outcome, now=T0 + 1e6, only_if_lease_expired=guard
                    )
        with pytest.raises(LeaseLostError):
            await backend.append_event(
                job.task_id, fence, "log", "x", now=T0 + 10, progress=Progress(percent=1)
            )
    # Cancelling is a no-op that says so.
    same, changed = await backend.cancel(job.task_id, now=T0 + 10)
    assert changed is False
    assert same.model_dump() == before[0]
    # Heartbeats do not revive it; it is not an expired lease.
    assert await backend.heartbeat("w1", {job.task_id: job.fence}, now=T0 + 10, lease_s=LEASE) == {}
    assert await backend.expired_leases(now=T0 + 1e6, limit=10) == []
    assert await snapshot(backend, job.task_id) == before


async def test_cancel_a_queued_job(backend: Backend) -> None:
    job = await enqueue(backend, ttl_s=300.0)
    cancelled, changed = await backend.cancel(job.task_id, now=T0 + 7)
    assert changed is True
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.model_dump() == cancelled.model_dump()
    assert cancelled.status == JobStatus.CANCELLED
    assert cancelled.finished_at == T0 + 7
    assert cancelled.expires_at == T0 + 7 + 300.0
    assert cancelled.lease_expires_at is None
    assert (cancelled.attempts, cancelled.fence, cancelled.history) == (0, 0, [])
    events = await backend.events(job.task_id)
    assert [(e.seq, e.type, e.data, e.at) for e in events] == [
        (1, "status", {"status": "queued"}, T0),
        (2, "status", {"status": "cancelled"}, T0 + 7),
    ]
    assert await backend.claim("w1", limit=10, now=T0 + 10, lease_s=LEASE) == []
    # Nobody was running it, so no worker gets a signal.
    assert await backend.poll_cancellations("w1") == {}


async def test_cancel_a_delayed_job(backend: Backend) -> None:
    job = await enqueue(backend, run_at=T0 + 100)
    cancelled, changed = await backend.cancel(job.task_id, now=T0 + 1)
    assert changed is True and cancelled.status == JobStatus.CANCELLED
    assert await backend.claim("w1", limit=10, now=T0 + 200, lease_s=LEASE) == []


async def test_cancel_a_processing_job(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING, worker="w1", ttl_s=300.0)
    other = await drive(backend, JobStatus.PROCESSING, worker="w2")
    cancelled, changed = await backend.cancel(job.task_id, now=T0 + 9)
    assert changed is True
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.model_dump() == cancelled.model_dump()
    assert cancelled.status == JobStatus.CANCELLED
    assert cancelled.finished_at == T0 + 9
    assert cancelled.expires_at == T0 + 9 + 300.0
    assert cancelled.lease_expires_at is None
    assert (cancelled.attempts, cancelled.fence) == (1, 1)
    record = cancelled.history[-1]
    assert (record.finished_at, record.outcome) == (T0 + 9, "cancelled")
    assert (await event_data(backend, job.task_id))[-1] == ("status", {"status": "cancelled"})

    # The signal goes to the worker holding it, with its fence, exactly once.
    assert await backend.poll_cancellations("w2") == {}
    assert await backend.poll_cancellations("w1") == {job.task_id: job.fence}
    assert await backend.poll_cancellations("w1") == {}
    # That worker's writes are refused from now on; the other worker is unaffected.
    with pytest.raises(LeaseLostError):
        await backend.finish(job.task_id, job.fence, Complete(result=1), now=T0 + 10)
    with pytest.raises(LeaseLostError):
        await backend.append_event(job.task_id, job.fence, "log", "x", now=T0 + 10)
    assert await backend.heartbeat("w1", {job.task_id: job.fence}, now=T0 + 10, lease_s=LEASE) == {}
    held = {other.task_id: other.fence}
    assert await backend.heartbeat("w2", held, now=T0 + 10, lease_s=LEASE) == held


async def test_signals_collect_per_worker(backend: Backend) -> None:
    a = await drive(backend, JobStatus.PROCESSING, worker="w1")
    b = await drive(backend, JobStatus.PROCESSING, worker="w1")
    c = await drive(backend, JobStatus.PROCESSING, worker="w2")
    for job in (a, b, c):
        await backend.cancel(job.task_id, now=T0 + 5)
    assert await backend.poll_cancellations("w1") == {a.task_id: a.fence, b.task_id: b.fence}
    assert await backend.poll_cancellations("w2") == {c.task_id: c.fence}
    assert await backend.poll_cancellations("w1") == {}
    assert await backend.poll_cancellations("w2") == {}


async def test_the_signal_outlives_the_jobs_delete(backend: Backend) -> None:
    # Cancel, then delete at once (the delete's 409 says "cancel it first"): the attempt must
    # still hear of it. The delete took the signal, and the handler ran on until the worker's
    # next heartbeat found its lease gone (10 s in the review's repro).
    job = await drive(backend, JobStatus.PROCESSING, worker="w1")
    await backend.cancel(job.task_id, now=T0 + 5)
    assert await backend.delete(job.task_id) is True
    assert await backend.poll_cancellations("w1") == {job.task_id: job.fence}
    assert await backend.poll_cancellations("w1") == {}


async def test_the_signal_names_the_current_attempt(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING, worker="w1")
    await backend.finish(job.task_id, job.fence, RetryAt(error(), run_at=T0 + 2), now=T0 + 2)
    again = await claim_one(backend, job.task_id, worker="w2", now=T0 + 3)
    await backend.cancel(job.task_id, now=T0 + 4)
    assert await backend.poll_cancellations("w1") == {}
    assert await backend.poll_cancellations("w2") == {job.task_id: again.fence}
    assert again.fence == 2


async def test_cancel_a_missing_job(backend: Backend) -> None:
    with pytest.raises(JobNotFoundError) as raised:
        await backend.cancel("task_missing", now=T0)
    assert raised.value.task_id == "task_missing"
    assert await backend.get("task_missing") is None


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.PROCESSING])
async def test_cancel_is_idempotent(backend: Backend, status: JobStatus) -> None:
    job = await drive(backend, status)
    first, changed = await backend.cancel(job.task_id, now=T0 + 5)
    assert changed is True
    after_first = await snapshot(backend, job.task_id)
    second, changed_again = await backend.cancel(job.task_id, now=T0 + 50)
    assert changed_again is False
    assert second.model_dump() == first.model_dump()
    assert second.finished_at == T0 + 5  # the first cancel's time stays
    assert await snapshot(backend, job.task_id) == after_first
    signals = await backend.poll_cancellations("w1")
    expected = {job.task_id: job.fence} if status == JobStatus.PROCESSING else {}
    assert signals == expected
    assert await backend.poll_cancellations("w1") == {}


async def test_a_retrying_job_can_be_cancelled(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.finish(job.task_id, job.fence, RetryAt(error(), run_at=T0 + 60), now=T0 + 2)
    cancelled, changed = await backend.cancel(job.task_id, now=T0 + 3)
    assert changed is True and cancelled.status == JobStatus.CANCELLED
    assert cancelled.attempts == 1
    assert await backend.claim("w1", limit=10, now=T0 + 100, lease_s=LEASE) == []
    assert await backend.poll_cancellations("w1") == {}


async def test_stats_follow_cancellation(backend: Backend) -> None:
    queued = await drive(backend, JobStatus.QUEUED, priority=3)
    stats = await backend.stats(now=T0)
    assert stats.counts[JobStatus.QUEUED] == 1 and stats.queued_by_priority == {3: 1}
    await backend.cancel(queued.task_id, now=T0 + 1)
    stats = await backend.stats(now=T0)
    assert stats.counts[JobStatus.QUEUED] == 0 and stats.counts[JobStatus.CANCELLED] == 1
    assert stats.queued_by_priority == {}
    assert stats.dead_letter == 0
