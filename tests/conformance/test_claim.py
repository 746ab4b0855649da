"""claim (order, due time, limit, what a claim records) and heartbeat."""

from __future__ import annotations

from backburner.backends import Backend
from backburner.backends.base import WORKER_RETENTION_S, Complete, RetryAt, WorkerInfo
from backburner.models import AttemptRecord, JobStatus

from ._support import LEASE, T0, claim_one, drive, enqueue, error, event_data


async def test_higher_priority_is_claimed_first(backend: Backend) -> None:
    low = await enqueue(backend, priority=0)
    high_a = await enqueue(backend, priority=5)
    mid = await enqueue(backend, priority=1)
    high_b = await enqueue(backend, priority=5)
    negative = await enqueue(backend, priority=-3)
    claimed = await backend.claim("w1", limit=10, now=T0, lease_s=LEASE)
    expected = [high_a, high_b, mid, low, negative]
    assert [j.task_id for j in claimed] == [j.task_id for j in expected]


async def test_claim_one_at_a_time_follows_priority(backend: Backend) -> None:
    jobs = [await enqueue(backend, priority=p) for p in (1, 3, 2, 3, 0)]
    order = [(await claim_one(backend, now=T0)).task_id for _ in jobs]
    assert order == [jobs[i].task_id for i in (1, 3, 2, 0, 4)]
    assert await backend.claim("w1", limit=1, now=T0, lease_s=LEASE) == []


async def test_fifo_within_a_priority_by_enqueue_order(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(8)]
    claimed = await backend.claim("w1", limit=8, now=T0, lease_s=LEASE)
    assert [j.task_id for j in claimed] == [j.task_id for j in jobs]


async def test_fifo_within_a_priority_is_by_run_at_first(backend: Backend) -> None:
    late = await enqueue(backend, now=T0, run_at=T0 + 3)
    early = await enqueue(backend, now=T0, run_at=T0 + 1)
    middle = await enqueue(backend, now=T0, run_at=T0 + 2)
    urgent_late = await enqueue(backend, now=T0, run_at=T0 + 3, priority=1)
    claimed = await backend.claim("w1", limit=10, now=T0 + 10, lease_s=LEASE)
    expected = [urgent_late, early, middle, late]
    assert [j.task_id for j in claimed] == [j.task_id for j in expected]


async def test_a_job_is_not_claimed_before_it_is_due(backend: Backend) -> None:
    later = await enqueue(backend, now=T0, run_at=T0 + 10)
    assert await backend.claim("w1", limit=5, now=T0, lease_s=LEASE) == []
    assert await backend.claim("w1", limit=5, now=T0 + 9.999, lease_s=LEASE) == []
    stored = await backend.get(later.task_id)
    assert stored is not None and stored.status == JobStatus.QUEUED and stored.attempts == 0
    claimed = await backend.claim("w1", limit=5, now=T0 + 10, lease_s=LEASE)
    assert [j.task_id for j in claimed] == [later.task_id]


async def test_a_due_low_priority_job_beats_an_undue_high_priority_one(backend: Backend) -> None:
    await enqueue(backend, now=T0, run_at=T0 + 60, priority=9)
    due = await enqueue(backend, now=T0, priority=0)
    claimed = await backend.claim("w1", limit=5, now=T0 + 1, lease_s=LEASE)
    assert [j.task_id for j in claimed] == [due.task_id]


async def test_limit_is_respected(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(5)]
    batches = [await backend.claim("w1", limit=2, now=T0, lease_s=LEASE) for _ in range(4)]
    assert [len(b) for b in batches] == [2, 2, 1, 0]
    seen = [j.task_id for batch in batches for j in batch]
    assert seen == [j.task_id for j in jobs]


async def test_limit_zero_claims_nothing(backend: Backend) -> None:
    job = await enqueue(backend)
    assert await backend.claim("w1", limit=0, now=T0, lease_s=LEASE) == []
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.status == JobStatus.QUEUED
    assert stored.attempts == 0 and stored.fence == 0
    assert len(await backend.events(job.task_id)) == 1


async def test_claim_on_an_empty_queue(backend: Backend) -> None:
    assert await backend.claim("w1", limit=10, now=T0, lease_s=LEASE) == []


async def test_claim_records_the_attempt(backend: Backend) -> None:
    job = await enqueue(backend, now=T0)
    claimed = await claim_one(backend, job.task_id, worker="w-7", now=T0 + 4, lease_s=45.0)
    stored = await backend.get(job.task_id)
    assert stored is not None
    for j in (claimed, stored):
        assert j.status == JobStatus.PROCESSING
        assert j.attempts == 1
        assert j.fence == 1
        assert j.worker_id == "w-7"
        assert j.lease_expires_at == T0 + 4 + 45.0
        assert j.started_at == T0 + 4
        assert j.history == [
            AttemptRecord(attempt=1, worker_id="w-7", started_at=T0 + 4),
        ]
        assert j.finished_at is None and j.expires_at is None
    events = await backend.events(job.task_id)
    assert [e.seq for e in events] == [1, 2]
    assert events[1].type == "status"
    assert events[1].data == {"status": "processing", "attempt": 1, "worker_id": "w-7"}
    assert events[1].at == T0 + 4


async def test_a_processing_job_is_not_claimed_again(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    # Even long after its lease expired: only the sweeper re-queues a job.
    assert await backend.claim("w2", limit=10, now=T0 + 10_000, lease_s=LEASE) == []
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.worker_id == "w1" and stored.fence == 1


async def test_each_claim_increments_attempts_and_fence(backend: Backend) -> None:
    job = await enqueue(backend, max_attempts=5)
    for n in range(1, 4):
        claimed = await claim_one(backend, job.task_id, worker=f"w{n}", now=T0 + n)
        assert (claimed.attempts, claimed.fence) == (n, n)
        assert [h.attempt for h in claimed.history] == list(range(1, n + 1))
        assert [h.worker_id for h in claimed.history] == [f"w{i}" for i in range(1, n + 1)]
        await backend.finish(
            job.task_id, claimed.fence, RetryAt(error(), run_at=T0 + n), now=T0 + n
        )
    statuses = [d["status"] for t, d in await event_data(backend, job.task_id) if t == "status"]
    assert statuses == ["queued"] + ["processing", "queued"] * 3


# -- heartbeat ------------------------------------------------------------------------------------


async def test_heartbeat_extends_only_this_workers_leases(backend: Backend) -> None:
    a = await drive(backend, JobStatus.PROCESSING, worker="w1")
    b = await drive(backend, JobStatus.PROCESSING, worker="w1")
    c = await drive(backend, JobStatus.PROCESSING, worker="w2")
    queued = await enqueue(backend)
    asked = {a.task_id: a.fence, b.task_id: b.fence, c.task_id: c.fence, queued.task_id: 0}
    held = await backend.heartbeat("w1", asked, now=T0 + 20, lease_s=60.0)
    assert held == {a.task_id: a.fence, b.task_id: b.fence}
    for task_id in (a.task_id, b.task_id):
        stored = await backend.get(task_id)
        assert stored is not None and stored.lease_expires_at == T0 + 80
    other = await backend.get(c.task_id)
    assert other is not None and other.lease_expires_at == c.lease_expires_at == T0 + 1 + LEASE
    still_queued = await backend.get(queued.task_id)
    assert still_queued is not None and still_queued.lease_expires_at is None


async def test_heartbeat_writes_no_events_and_is_repeatable(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    first = await backend.heartbeat("w1", {job.task_id: 1}, now=T0 + 5, lease_s=LEASE)
    second = await backend.heartbeat("w1", {job.task_id: 1}, now=T0 + 5, lease_s=LEASE)
    assert first == second == {job.task_id: 1}
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.lease_expires_at == T0 + 5 + LEASE
    assert stored.status == JobStatus.PROCESSING and stored.fence == 1 and stored.attempts == 1
    assert len(await backend.events(job.task_id)) == 2


async def test_heartbeat_omits_jobs_the_worker_no_longer_holds(backend: Backend) -> None:
    done = await drive(backend, JobStatus.PROCESSING)
    cancelled = await drive(backend, JobStatus.PROCESSING)
    kept = await drive(backend, JobStatus.PROCESSING)
    await backend.finish(done.task_id, done.fence, Complete(result=1), now=T0 + 3)
    await backend.cancel(cancelled.task_id, now=T0 + 3)
    asked = {j.task_id: j.fence for j in (done, cancelled, kept)}
    held = await backend.heartbeat("w1", asked, now=T0 + 4, lease_s=LEASE)
    assert held == {kept.task_id: kept.fence}
    finished = await backend.get(done.task_id)
    assert finished is not None and finished.lease_expires_at is None


async def test_heartbeat_records_the_worker_in_stats(backend: Backend) -> None:
    assert (await backend.stats(now=T0)).workers == []
    assert await backend.heartbeat("w1", {}, now=T0, lease_s=LEASE) == {}
    three = {"task_gone1": 1, "task_gone2": 1, "task_gone3": 1}  # running = how many it asks for
    assert await backend.heartbeat("w2", three, now=T0 + 5, lease_s=LEASE) == {}
    await backend.heartbeat("w1", {"task_gone1": 1, "task_gone2": 2}, now=T0 + 10, lease_s=LEASE)
    workers = (await backend.stats(now=T0 + 10, worker_window_s=60.0)).workers
    assert workers == [
        WorkerInfo(worker_id="w1", last_seen=T0 + 10, running=2, started_at=T0),
        WorkerInfo(worker_id="w2", last_seen=T0 + 5, running=3, started_at=T0 + 5),
    ]
    # Only workers seen within the window are listed.
    recent = (await backend.stats(now=T0 + 68, worker_window_s=60.0)).workers
    assert [w.worker_id for w in recent] == ["w1"]
    assert (await backend.stats(now=T0 + 1000, worker_window_s=60.0)).workers == []


async def test_purge_forgets_workers_not_seen_for_the_retention(backend: Backend) -> None:
    await backend.heartbeat("gone", {}, now=T0, lease_s=LEASE)
    await backend.heartbeat("alive", {}, now=T0, lease_s=LEASE)
    later = T0 + WORKER_RETENTION_S + 10
    await backend.heartbeat("alive", {}, now=later - 5, lease_s=LEASE)
    everyone = WORKER_RETENTION_S * 10  # a window that would list a worker of any age
    listed = (await backend.stats(now=later, worker_window_s=everyone)).workers
    assert [w.worker_id for w in listed] == ["alive", "gone"]
    await backend.purge_expired(now=T0 + WORKER_RETENTION_S, limit=100)  # not yet: exactly at it
    assert len((await backend.stats(now=later, worker_window_s=everyone)).workers) == 2
    await backend.purge_expired(now=later, limit=100)
    kept = (await backend.stats(now=later, worker_window_s=everyone)).workers
    assert [(w.worker_id, w.started_at) for w in kept] == [("alive", T0)]


async def test_worker_ids_are_stored_verbatim(backend: Backend) -> None:
    worker = 'host "a"\\b/é\n{1}'
    job = await enqueue(backend)
    claimed = await claim_one(backend, job.task_id, worker=worker, now=T0)
    assert claimed.worker_id == worker and claimed.history[0].worker_id == worker
    events = await backend.events(job.task_id)
    assert events[-1].data == {"status": "processing", "attempt": 1, "worker_id": worker}
    renewed = await backend.heartbeat(worker, {job.task_id: 1}, now=T0 + 1, lease_s=LEASE)
    assert renewed == {job.task_id: 1}
    await backend.cancel(job.task_id, now=T0 + 2)
    assert await backend.poll_cancellations(worker) == {job.task_id: 1}


async def test_heartbeat_renews_only_the_attempts_it_names(backend: Backend) -> None:
    named = await drive(backend, JobStatus.PROCESSING, worker="w1")
    forgotten = await drive(backend, JobStatus.PROCESSING, worker="w1")
    stale = {named.task_id: named.fence + 1}  # a fence this attempt never had
    assert await backend.heartbeat("w1", stale, now=T0 + 20, lease_s=LEASE) == {}
    held = {named.task_id: named.fence}
    assert await backend.heartbeat("w1", held, now=T0 + 20, lease_s=LEASE) == held
    renewed = await backend.get(named.task_id)
    left = await backend.get(forgotten.task_id)
    assert renewed is not None and renewed.lease_expires_at == T0 + 20 + LEASE
    # A job the worker holds but no longer runs is left to expire.
    assert left is not None and left.lease_expires_at == forgotten.lease_expires_at
    expired = await backend.expired_leases(now=T0 + 2 + LEASE, limit=5)
    assert [j.task_id for j in expired] == [forgotten.task_id]


async def test_claim_takes_only_the_named_types(backend: Backend) -> None:
    other = await enqueue(backend, "other", priority=50)
    mine = await enqueue(backend, "mine")
    assert await backend.claim("w1", limit=5, now=T0, lease_s=LEASE, types=[]) == []
    claimed = await backend.claim("w1", limit=5, now=T0, lease_s=LEASE, types=["mine", "x"])
    assert [j.task_id for j in claimed] == [mine.task_id]
    stored = await backend.get(other.task_id)
    assert stored is not None and stored.status == JobStatus.QUEUED
    anything = await backend.claim("w1", limit=5, now=T0, lease_s=LEASE)
    assert [j.task_id for j in anything] == [other.task_id]
