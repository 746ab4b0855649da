"""Concurrent callers: claims, fencing after a takeover, cancel/sweeper vs the owner, enqueue.

Each race runs on one backend object and, where it matters, across two connections to the
same store (``peer``: a second SQLiteBackend on the file, as another process would open it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, RetryAt
from backburner.errors import (
    IdempotencyConflictError,
    InvalidTransitionError,
    LeaseLostError,
    QueueFullError,
)
from backburner.models import JobStatus

from ._support import LEASE, T0, TTL, claim_one, drive, enqueue, error, new_job, opened, peer

CONNECTIONS = ["one-connection", "two-connections"]


def _pair(backend: Backend, other: Backend, connections: str) -> tuple[Backend, Backend]:
    return (backend, other if connections == "two-connections" else backend)


@pytest.mark.parametrize("connections", CONNECTIONS)
async def test_concurrent_claimers_never_share_a_job(backend: Backend, connections: str) -> None:
    created = await asyncio.gather(
        *(backend.enqueue(new_job(payload={"i": i})) for i in range(200))
    )
    ids = {job.task_id for job, _ in created}
    assert len(ids) == 200
    async with peer(backend) as other:
        first, second = _pair(backend, other, connections)
        calls = [
            (first if i % 2 == 0 else second).claim(
                "w1" if i % 2 == 0 else "w2", limit=5, now=T0, lease_s=LEASE
            )
            for i in range(60)
        ]
        results = await asyncio.gather(*calls)
        claimed = [job for batch in results for job in batch]
        assert len(claimed) == 200
        assert {j.task_id for j in claimed} == ids
        assert await second.claim("w2", limit=10, now=T0, lease_s=LEASE) == []
    for i, batch in enumerate(results):
        owner = "w1" if i % 2 == 0 else "w2"
        for job in batch:
            assert (job.worker_id, job.attempts, job.fence) == (owner, 1, 1)
    for job in claimed[::10]:
        stored = await backend.get(job.task_id)
        assert stored is not None and stored.worker_id == job.worker_id
        assert stored.status == JobStatus.PROCESSING and stored.fence == 1
        assert [e.type for e in await backend.events(job.task_id)] == ["status", "status"]
    stats = await backend.stats(now=T0)
    assert stats.counts[JobStatus.PROCESSING] == 200 and stats.counts[JobStatus.QUEUED] == 0


@pytest.mark.parametrize("connections", CONNECTIONS)
async def test_a_stale_owner_loses_to_the_new_one(backend: Backend, connections: str) -> None:
    job = await drive(backend, JobStatus.PROCESSING, worker="w1")  # lease until T0 + 1 + LEASE
    late = T0 + 100
    async with peer(backend) as other:
        _, sweeper = _pair(backend, other, connections)
        (expired,) = await sweeper.expired_leases(now=late, limit=10)
        assert (expired.task_id, expired.fence) == (job.task_id, job.fence)
        lost = error("lease_expired", "worker w1 stopped renewing its lease")
        await sweeper.finish(
            job.task_id,
            expired.fence,
            RetryAt(lost, run_at=late),
            now=late,
            only_if_lease_expired=True,
        )
        # Between the sweep and the next claim the old owner is already fenced off.
        with pytest.raises(LeaseLostError):
            await backend.finish(job.task_id, job.fence, Complete(result="old"), now=late)
        taken = await claim_one(sweeper, job.task_id, worker="w2", now=late + 1)
        assert taken.fence == job.fence + 1
        before = await backend.get(job.task_id)
        with pytest.raises(LeaseLostError):
            await backend.finish(job.task_id, job.fence, Complete(result="old"), now=late + 2)
        with pytest.raises(LeaseLostError):
            await backend.append_event(job.task_id, job.fence, "log", "old", now=late + 2)
        old = {job.task_id: job.fence}
        assert await backend.heartbeat("w1", old, now=late + 2, lease_s=LEASE) == {}
        assert await backend.get(job.task_id) == before
        done = await sweeper.finish(job.task_id, taken.fence, Complete(result="new"), now=late + 3)
    assert done.result == "new" and done.status == JobStatus.COMPLETED
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.result == "new"
    assert [(h.worker_id, h.outcome) for h in stored.history] == [
        ("w1", "retry"),
        ("w2", "completed"),
    ]
    completions = [e for e in await backend.events(job.task_id) if e.data.get("result")]
    assert [e.data["result"] for e in completions] == ["new"]


@pytest.mark.parametrize("cancel_first", [True, False], ids=["cancel-first", "finish-first"])
async def test_cancel_racing_finish(backend: Backend, cancel_first: bool) -> None:
    jobs = [await drive(backend, JobStatus.PROCESSING, payload={"i": i}) for i in range(10)]
    async with peer(backend) as api:
        for job in jobs:
            cancel = api.cancel(job.task_id, now=T0 + 5)
            finish = backend.finish(job.task_id, job.fence, Complete(result="done"), now=T0 + 5)
            pair = (cancel, finish) if cancel_first else (finish, cancel)
            results = await asyncio.gather(*pair, return_exceptions=True)
            cancelled, finished = results if cancel_first else results[::-1]
            assert not isinstance(cancelled, BaseException)
            stored, changed = cancelled
            final = await backend.get(job.task_id)
            assert final is not None
            statuses = [
                e.data["status"] for e in await backend.events(job.task_id) if e.type == "status"
            ]
            if final.status == JobStatus.COMPLETED:
                assert changed is False and stored.status == JobStatus.COMPLETED
                assert not isinstance(finished, BaseException) and finished.result == "done"
                assert statuses[-1] == "completed" and "cancelled" not in statuses
                assert await backend.poll_cancellations("w1") == {}
            else:
                assert final.status == JobStatus.CANCELLED
                assert changed is True and stored.status == JobStatus.CANCELLED
                assert isinstance(finished, LeaseLostError)
                assert final.result is None
                assert statuses[-1] == "cancelled" and "completed" not in statuses
                assert await backend.poll_cancellations("w1") == {job.task_id: job.fence}


@pytest.mark.parametrize("sweeper_first", [True, False], ids=["sweeper-first", "owner-first"])
async def test_lease_expiry_racing_the_owners_finish(backend: Backend, sweeper_first: bool) -> None:
    jobs = [await drive(backend, JobStatus.PROCESSING, payload={"i": i}) for i in range(10)]
    late = T0 + 1 + LEASE + 1  # every lease has expired
    lost = error("lease_expired", "lease expired")
    async with peer(backend) as sweeper:
        for job in jobs:
            sweep = sweeper.finish(
                job.task_id, job.fence, RetryAt(lost, late), now=late, only_if_lease_expired=True
            )
            own = backend.finish(job.task_id, job.fence, Complete(result="mine"), now=late)
            pair = (sweep, own) if sweeper_first else (own, sweep)
            results = await asyncio.gather(*pair, return_exceptions=True)
            swept, owned = results if sweeper_first else results[::-1]
            winners = [r for r in (swept, owned) if not isinstance(r, BaseException)]
            losers = [r for r in (swept, owned) if isinstance(r, BaseException)]
            assert len(winners) == 1 and len(losers) == 1
            assert isinstance(losers[0], LeaseLostError)
            final = await backend.get(job.task_id)
            assert final is not None
            if winners[0] is owned:
                assert final.status == JobStatus.COMPLETED and final.result == "mine"
            else:
                assert final.status == JobStatus.QUEUED and final.error == lost
                assert final.attempts == 1 and final.result is None
            assert final.model_dump() == winners[0].model_dump()


@pytest.mark.parametrize("beat_first", [True, False], ids=["heartbeat-first", "sweeper-first"])
async def test_heartbeat_racing_the_sweeper(backend: Backend, beat_first: bool) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    late = T0 + 1 + LEASE + 1
    async with peer(backend) as sweeper:
        beat = backend.heartbeat("w1", {job.task_id: job.fence}, now=late, lease_s=LEASE)
        sweep = sweeper.finish(
            job.task_id, job.fence, Fail(error(), ttl_s=TTL), now=late, only_if_lease_expired=True
        )
        pair = (beat, sweep) if beat_first else (sweep, beat)
        results = await asyncio.gather(*pair, return_exceptions=True)
        held, swept = results if beat_first else results[::-1]
    assert isinstance(held, dict)
    final = await backend.get(job.task_id)
    assert final is not None
    if job.task_id in held:  # the heartbeat landed first: the sweeper must back off
        assert isinstance(swept, LeaseLostError)
        assert final.status == JobStatus.PROCESSING and final.lease_expires_at == late + LEASE
    else:
        assert not isinstance(swept, BaseException)
        assert final.status == JobStatus.FAILED and held == {}


@pytest.mark.parametrize("connections", CONNECTIONS)
async def test_concurrent_enqueues_with_one_key(backend: Backend, connections: str) -> None:
    async with peer(backend) as other:
        first, second = _pair(backend, other, connections)
        attempts = [new_job(payload={"q": 1}, idempotency_key="same") for _ in range(100)]
        results = await asyncio.gather(
            *((first if i % 2 == 0 else second).enqueue(n) for i, n in enumerate(attempts))
        )
    assert sum(created for _, created in results) == 1
    task_ids = {job.task_id for job, _ in results}
    assert len(task_ids) == 1
    (winner,) = task_ids
    assert winner in {n.task_id for n in attempts}
    assert [j.task_id for j in (await backend.list_jobs()).jobs] == [winner]
    assert len(await backend.events(winner)) == 1
    assert (await backend.stats(now=T0)).counts[JobStatus.QUEUED] == 1


@pytest.mark.parametrize("connections", CONNECTIONS)
async def test_concurrent_conflicting_enqueues(backend: Backend, connections: str) -> None:
    async with peer(backend) as other:
        first, second = _pair(backend, other, connections)
        attempts = [new_job(payload={"q": i}, idempotency_key="same") for i in range(40)]
        results = await asyncio.gather(
            *((first if i % 2 == 0 else second).enqueue(n) for i, n in enumerate(attempts)),
            return_exceptions=True,
        )
    stored = [r for r in results if not isinstance(r, BaseException)]
    conflicts = [r for r in results if isinstance(r, BaseException)]
    assert len(stored) == 1 and stored[0][1] is True
    winner = stored[0][0].task_id
    assert len(conflicts) == 39
    assert all(isinstance(c, IdempotencyConflictError) for c in conflicts)
    assert {c.task_id for c in conflicts if isinstance(c, IdempotencyConflictError)} == {winner}
    assert [j.task_id for j in (await backend.list_jobs()).jobs] == [winner]


@pytest.mark.parametrize("connections", CONNECTIONS)
async def test_concurrent_enqueues_respect_the_bound(
    backend_kind: str, tmp_path: Path, connections: str
) -> None:
    async with opened(backend_kind, tmp_path / "bounded", max_queue_size=10) as bounded:
        async with peer(bounded) as other:
            first, second = _pair(bounded, other, connections)
            results = await asyncio.gather(
                *((first if i % 2 == 0 else second).enqueue(new_job()) for i in range(50)),
                return_exceptions=True,
            )
        created = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(created) == 10 and all(c for _, c in created)
        assert len(refused) == 40 and all(isinstance(r, QueueFullError) for r in refused)
        assert (await bounded.stats(now=T0)).counts[JobStatus.QUEUED] == 10


@pytest.mark.parametrize("connections", CONNECTIONS)
async def test_concurrent_events_get_distinct_seqs(backend: Backend, connections: str) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    async with peer(backend) as other:
        first, second = _pair(backend, other, connections)
        seqs = await asyncio.gather(
            *(
                (first if i % 2 == 0 else second).append_event(
                    job.task_id, job.fence, "log", {"i": i}, now=T0 + 2
                )
                for i in range(50)
            )
        )
    assert sorted(seqs) == list(range(3, 53))
    events = await backend.events(job.task_id)
    assert [e.seq for e in events] == list(range(1, 53))
    assert sorted(e.data["i"] for e in events[2:]) == list(range(50))


async def test_concurrent_cancels_change_once(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    async with peer(backend) as other:
        results = await asyncio.gather(
            *((backend if i % 2 else other).cancel(job.task_id, now=T0 + 5) for i in range(20))
        )
    assert sum(changed for _, changed in results) == 1
    assert all(j.status == JobStatus.CANCELLED for j, _ in results)
    statuses = [e.data["status"] for e in await backend.events(job.task_id)]
    assert statuses.count("cancelled") == 1
    assert await backend.poll_cancellations("w1") == {job.task_id: job.fence}


async def test_concurrent_replays_apply_once(backend: Backend) -> None:
    failed = await drive(backend, JobStatus.FAILED)
    async with peer(backend) as other:
        results = await asyncio.gather(
            *(
                (backend if i % 2 else other).replay(failed.task_id, now=T0 + 5, extra_attempts=1)
                for i in range(10)
            ),
            return_exceptions=True,
        )
    ok = [r for r in results if not isinstance(r, BaseException)]
    assert len(ok) == 1
    assert all(isinstance(r, InvalidTransitionError) for r in results if r not in ok)
    replays = [e for e in await backend.events(failed.task_id) if e.data.get("replayed")]
    assert len(replays) == 1


async def test_cancels_racing_a_claim(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(40)]
    async with peer(backend) as api:
        results = await asyncio.gather(
            backend.claim("w1", limit=40, now=T0, lease_s=LEASE),
            *(api.cancel(j.task_id, now=T0) for j in jobs[::2]),
            backend.claim("w1", limit=40, now=T0, lease_s=LEASE),
        )
    claimed = {j.task_id for j in results[0]} | {j.task_id for j in results[-1]}
    targets = {j.task_id for j in jobs[::2]}
    signals = await backend.poll_cancellations("w1")
    for job in jobs:
        final = await backend.get(job.task_id)
        assert final is not None
        if job.task_id in targets:
            assert final.status == JobStatus.CANCELLED
            # Claimed before the cancel: the worker gets a signal; else it never ran.
            assert (job.task_id in signals) == (job.task_id in claimed)
            assert final.attempts == (1 if job.task_id in claimed else 0)
        else:
            assert final.status == JobStatus.PROCESSING and job.task_id in claimed
    assert set(signals) <= claimed
