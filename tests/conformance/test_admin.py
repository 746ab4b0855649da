"""replay, delete, expired_leases and purge_expired."""

from __future__ import annotations

import pytest

from backburner.backends import Backend
from backburner.backends.base import CHILD_KEEP_S, Complete, Fail
from backburner.errors import InvalidTransitionError, JobNotFoundError
from backburner.models import JobStatus

from ._support import LEASE, T0, claim_one, drive, enqueue, error, new_job, snapshot

TERMINAL = [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED]

# -- replay ---------------------------------------------------------------------------------------


async def test_replay_requeues_a_failed_job(backend: Backend) -> None:
    failed = await drive(backend, JobStatus.FAILED, max_attempts=1)  # finished at T0 + 2
    assert failed.expires_at is not None
    replayed = await backend.replay(failed.task_id, now=T0 + 100, extra_attempts=2)
    stored = await backend.get(failed.task_id)
    assert stored is not None and stored.model_dump() == replayed.model_dump()
    assert replayed.status == JobStatus.QUEUED
    assert replayed.attempts == 1
    assert replayed.max_attempts == 1 + 2
    assert replayed.run_at == T0 + 100
    assert replayed.error is None
    assert replayed.finished_at is None and replayed.expires_at is None
    assert replayed.worker_id is None and replayed.lease_expires_at is None
    assert replayed.history == failed.history  # kept
    events = await backend.events(failed.task_id)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert (events[-1].type, events[-1].data, events[-1].at) == (
        "status",
        {"status": "queued", "replayed": True},
        T0 + 100,
    )
    stats = await backend.stats(now=T0 + 100)
    assert stats.dead_letter == 0 and stats.counts[JobStatus.QUEUED] == 1


async def test_a_replayed_job_runs_again_with_attempts_continuing(backend: Backend) -> None:
    failed = await drive(backend, JobStatus.FAILED, max_attempts=1)
    await backend.replay(failed.task_id, now=T0 + 100, extra_attempts=1)
    assert await backend.claim("w2", limit=1, now=T0 + 99, lease_s=LEASE) == []
    again = await claim_one(backend, failed.task_id, worker="w2", now=T0 + 100)
    assert (again.attempts, again.fence, again.max_attempts) == (2, 2, 2)
    assert [(h.attempt, h.worker_id, h.outcome) for h in again.history] == [
        (1, "w1", "failed"),
        (2, "w2", None),
    ]
    done = await backend.finish(failed.task_id, again.fence, Complete(result="ok"), now=T0 + 101)
    assert done.status == JobStatus.COMPLETED and done.result == "ok"


async def test_replay_zero_extra_attempts(backend: Backend) -> None:
    failed = await drive(backend, JobStatus.FAILED, max_attempts=5)
    replayed = await backend.replay(failed.task_id, now=T0 + 10, extra_attempts=0)
    assert replayed.status == JobStatus.QUEUED and replayed.max_attempts == 1


@pytest.mark.parametrize(
    "status",
    [JobStatus.QUEUED, JobStatus.PROCESSING, JobStatus.COMPLETED, JobStatus.CANCELLED],
)
async def test_only_failed_jobs_can_be_replayed(backend: Backend, status: JobStatus) -> None:
    job = await drive(backend, status)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(InvalidTransitionError):
        await backend.replay(job.task_id, now=T0 + 10, extra_attempts=1)
    assert await snapshot(backend, job.task_id) == before


@pytest.mark.parametrize("running", [False, True])
async def test_a_cancelled_job_is_replayed_only_when_asked(backend: Backend, running: bool) -> None:
    # (A pipeline's replay runs again the children its failure cancelled, queued or running.)
    job = await enqueue(backend, now=T0)
    if running:
        await claim_one(backend, job.task_id, worker="w1", now=T0 + 1)
    cancelled, _ = await backend.cancel(job.task_id, now=T0 + 2)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(InvalidTransitionError):
        await backend.replay(job.task_id, now=T0 + 10, extra_attempts=1)
    assert await snapshot(backend, job.task_id) == before
    replayed = await backend.replay(job.task_id, now=T0 + 10, extra_attempts=1, cancelled_too=True)
    assert replayed.status == JobStatus.QUEUED and replayed.run_at == T0 + 10
    assert replayed.finished_at is None and replayed.expires_at is None
    assert replayed.max_attempts == cancelled.attempts + 1
    listed = await backend.list_jobs(status=JobStatus.QUEUED)
    assert [j.task_id for j in listed.jobs] == [job.task_id]
    stats = await backend.stats(now=T0 + 10)
    assert stats.counts[JobStatus.QUEUED] == 1 and stats.counts[JobStatus.CANCELLED] == 0
    again = await claim_one(backend, job.task_id, worker="w1", now=T0 + 11)
    # The cancel of the attempt it stopped is not one of this attempt's.
    signals = await backend.poll_cancellations("w1")
    assert signals.get(job.task_id) != again.fence
    done = await backend.finish(job.task_id, again.fence, Complete(result=1), now=T0 + 12)
    assert done.status == JobStatus.COMPLETED


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.COMPLETED])
async def test_cancelled_too_replays_no_other_status(backend: Backend, status: JobStatus) -> None:
    job = await drive(backend, status)
    with pytest.raises(InvalidTransitionError):
        await backend.replay(job.task_id, now=T0 + 10, extra_attempts=1, cancelled_too=True)


async def test_replay_twice_only_works_once(backend: Backend) -> None:
    failed = await drive(backend, JobStatus.FAILED)
    await backend.replay(failed.task_id, now=T0 + 10, extra_attempts=1)
    after = await snapshot(backend, failed.task_id)
    with pytest.raises(InvalidTransitionError):
        await backend.replay(failed.task_id, now=T0 + 11, extra_attempts=1)
    assert await snapshot(backend, failed.task_id) == after


async def test_replay_a_missing_job(backend: Backend) -> None:
    with pytest.raises(JobNotFoundError):
        await backend.replay("task_missing", now=T0, extra_attempts=1)


# -- delete ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", TERMINAL)
async def test_delete_a_terminal_job(backend: Backend, status: JobStatus) -> None:
    job = await drive(backend, status)
    keep = await drive(backend, status)
    assert await backend.delete(job.task_id) is True
    assert await backend.get(job.task_id) is None
    assert await backend.events(job.task_id) == []
    listed = [j.task_id for j in (await backend.list_jobs()).jobs]
    assert listed == [keep.task_id]
    assert (await backend.stats(now=T0)).counts[status] == 1
    assert await backend.delete(job.task_id) is False
    with pytest.raises(JobNotFoundError):
        await backend.cancel(job.task_id, now=T0 + 10)
    assert len(await backend.events(keep.task_id)) > 1


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.PROCESSING])
async def test_delete_refuses_a_live_job(backend: Backend, status: JobStatus) -> None:
    job = await drive(backend, status)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(InvalidTransitionError):
        await backend.delete(job.task_id)
    assert await snapshot(backend, job.task_id) == before


async def test_delete_a_missing_job(backend: Backend) -> None:
    assert await backend.delete("task_missing") is False


async def test_delete_frees_the_idempotency_key(backend: Backend) -> None:
    job = await drive(backend, JobStatus.COMPLETED, payload={"q": 1}, idempotency_key="k")
    assert await backend.delete(job.task_id) is True
    fresh, created = await backend.enqueue(new_job(payload={"q": 2}, idempotency_key="k"))
    assert created is True and fresh.task_id != job.task_id
    assert fresh.input == {"q": 2}


# -- expired_leases -------------------------------------------------------------------------------


async def test_expired_leases_lists_processing_jobs_by_lease_time(backend: Backend) -> None:
    first = await claim_one(backend, (await enqueue(backend)).task_id, now=T0, lease_s=10)
    second = await claim_one(backend, (await enqueue(backend)).task_id, now=T0, lease_s=20)
    third = await claim_one(backend, (await enqueue(backend)).task_id, now=T0, lease_s=30)
    done = await drive(backend, JobStatus.COMPLETED)
    await enqueue(backend)  # queued: no lease
    assert await backend.expired_leases(now=T0 + 5, limit=10) == []
    expired = await backend.expired_leases(now=T0 + 25, limit=10)
    assert {j.task_id for j in expired} == {first.task_id, second.task_id}
    assert all(j.status == JobStatus.PROCESSING for j in expired)
    assert {j.fence for j in expired} == {1}
    everything = await backend.expired_leases(now=T0 + 1000, limit=10)
    assert {j.task_id for j in everything} == {first.task_id, second.task_id, third.task_id}
    assert done.task_id not in {j.task_id for j in everything}
    # A pure read: nothing changed.
    stored = await backend.get(first.task_id)
    assert stored is not None and stored.status == JobStatus.PROCESSING


async def test_expired_leases_respects_the_limit(backend: Backend) -> None:
    for lease in (10, 20, 30):
        await claim_one(backend, (await enqueue(backend)).task_id, now=T0, lease_s=lease)
    assert len(await backend.expired_leases(now=T0 + 100, limit=2)) == 2
    assert len(await backend.expired_leases(now=T0 + 100, limit=1)) == 1


async def test_a_heartbeat_takes_a_job_off_the_expired_list(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)  # lease until T0 + 1 + LEASE
    late = T0 + 1 + LEASE + 10
    assert [j.task_id for j in await backend.expired_leases(now=late, limit=5)] == [job.task_id]
    await backend.heartbeat("w1", {job.task_id: job.fence}, now=late, lease_s=LEASE)
    assert await backend.expired_leases(now=late, limit=5) == []
    assert len(await backend.expired_leases(now=late + LEASE + 1, limit=5)) == 1


# -- purge_expired --------------------------------------------------------------------------------


async def test_purge_deletes_expired_terminal_jobs_with_their_events(backend: Backend) -> None:
    # completed at T0+2 with ttl 100 -> expires T0+102
    completed = await drive(backend, JobStatus.COMPLETED, ttl_s=100.0)
    # failed at T0+5 with a 40 s retention -> expires T0+45
    failing = await drive(backend, JobStatus.PROCESSING, now=T0 + 3)
    failed = await backend.finish(
        failing.task_id, failing.fence, Fail(error(), ttl_s=40.0), now=T0 + 5
    )
    assert failed.expires_at == T0 + 45
    # cancelled at T0+1 with ttl 1000 -> expires T0+1001
    cancelled = await drive(backend, JobStatus.CANCELLED, ttl_s=1000.0)
    processing = await drive(backend, JobStatus.PROCESSING, ttl_s=1.0)
    queued = await enqueue(backend, ttl_s=1.0)

    assert await backend.purge_expired(now=T0 + 44.9, limit=100) == 0
    assert await backend.purge_expired(now=T0 + 45, limit=100) == 1  # expires_at <= now
    assert await backend.get(failed.task_id) is None
    assert await backend.events(failed.task_id) == []
    assert (await backend.stats(now=T0)).dead_letter == 0

    assert await backend.purge_expired(now=T0 + 500, limit=100) == 1
    assert await backend.get(completed.task_id) is None
    assert await backend.events(completed.task_id) == []
    kept = await backend.get(cancelled.task_id)
    assert kept is not None and kept.status == JobStatus.CANCELLED
    assert len(await backend.events(cancelled.task_id)) == 2

    # Live jobs never expire, however late.
    assert await backend.purge_expired(now=T0 + 1e9, limit=100) == 1
    remaining = {j.task_id for j in (await backend.list_jobs()).jobs}
    assert remaining == {processing.task_id, queued.task_id}
    assert await backend.purge_expired(now=T0 + 1e9, limit=100) == 0


async def test_a_child_is_kept_while_its_parent_is_stored(backend: Backend) -> None:
    # A batch's first requests expired before the batch: its results called them never
    # queued. A failed pipeline's replay needs its children too.
    parent = await enqueue(backend, ttl_s=100_000.0, run_at=T0 + 25)  # (the child first)
    child = await drive(backend, JobStatus.COMPLETED, ttl_s=10.0, parent_id=parent.task_id)
    assert child.expires_at == T0 + 12
    assert await backend.purge_expired(now=T0 + 20, limit=10) == 0  # its parent runs
    kept = await backend.get(child.task_id)
    assert kept is not None and kept.expires_at == T0 + 20 + CHILD_KEEP_S
    (claimed,) = await backend.claim("w2", limit=1, now=T0 + 30, lease_s=LEASE)
    ended = await backend.finish(parent.task_id, claimed.fence, Complete(), now=T0 + 30)
    assert ended.expires_at == T0 + 100_030
    # Due again: kept until its parent's expiry, then both go.
    assert await backend.purge_expired(now=T0 + 20 + CHILD_KEEP_S, limit=10) == 0
    kept = await backend.get(child.task_id)
    assert kept is not None and kept.expires_at == T0 + 100_030
    assert await backend.purge_expired(now=T0 + 100_030, limit=10) == 2
    assert await backend.get(child.task_id) is None and await backend.get(parent.task_id) is None


async def test_purge_respects_the_limit(backend: Backend) -> None:
    for _ in range(3):
        await drive(backend, JobStatus.COMPLETED, ttl_s=10.0)
    assert await backend.purge_expired(now=T0 + 100, limit=2) == 2
    assert len((await backend.list_jobs()).jobs) == 1
    assert await backend.purge_expired(now=T0 + 100, limit=2) == 1
    assert (await backend.list_jobs()).jobs == []
    counts = (await backend.stats(now=T0)).counts
    assert sum(counts.values()) == 0


async def test_purge_frees_the_idempotency_key(backend: Backend) -> None:
    old = await drive(
        backend, JobStatus.COMPLETED, payload={"v": 1}, idempotency_key="k", ttl_s=10.0
    )
    # Before the purge the key still names the old job.
    existing, created = await backend.enqueue(new_job(payload={"v": 1}, idempotency_key="k"))
    assert created is False and existing.task_id == old.task_id
    assert await backend.purge_expired(now=T0 + 12, limit=10) == 1
    # After it the same key (even with other input) makes a new job.
    fresh, created = await backend.enqueue(
        new_job(payload={"v": 2}, idempotency_key="k", now=T0 + 13)
    )
    assert created is True
    assert fresh.task_id != old.task_id and fresh.status == JobStatus.QUEUED
    assert [e.seq for e in await backend.events(fresh.task_id)] == [1]


async def test_a_replayed_job_no_longer_expires(backend: Backend) -> None:
    failed = await drive(backend, JobStatus.FAILED)
    await backend.replay(failed.task_id, now=T0 + 10, extra_attempts=1)
    assert await backend.purge_expired(now=T0 + 1e9, limit=10) == 0
    assert await backend.get(failed.task_id) is not None
