"""Hand-off on Redis: an enqueue claims the job for a worker waiting idle and sends it to it.

The worker then starts the job without a claim round trip of its own. A claim of the worker's
own (not a finish's), a lapse or stop_waiting ends the registration; a job handed to a worker
that no longer takes it is returned by stop_waiting, or handed back by the worker when it has
no free slot.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from backburner import Backburner, JobContext
from backburner.backends import redis_waiting
from backburner.backends.base import Complete, NextClaim, Release
from backburner.backends.redis import RedisBackend
from backburner.backends.redis_catalog import hand_off_commands
from backburner.models import JobStatus
from backburner.worker.runner import Worker

from ..conformance._support import T0, enqueue
from ..conftest import REDIS_TEST_URL, drop_redis_keys
from ._workers import count_claims, redis_app, registered, running_worker

# Both event loops: the hand-off's subscription takes over a transport the worker's loop made.
pytestmark = [pytest.mark.timeout(60), pytest.mark.both_event_loops]


async def test_an_idle_worker_is_handed_the_job_its_enqueue_claims_for_it(
    engine: RedisBackend, client: Redis
) -> None:
    waiting = asyncio.create_task(
        engine.wait_for_jobs(now=T0, timeout=10.0, types=["summarize"], worker_id="w1", lease_s=45)
    )
    await registered(client, engine, "w1")
    job = await enqueue(engine, now=T0 + 1)
    handed = await asyncio.wait_for(waiting, 5)
    assert [h.task_id for h in handed] == [job.task_id]
    (got,) = handed
    assert got.status == JobStatus.PROCESSING
    assert (got.worker_id, got.fence, got.attempts) == ("w1", 1, 1)
    assert got.lease_expires_at == T0 + 1 + 45
    assert got == await engine.get(job.task_id)
    events = await engine.events(job.task_id)
    assert events[-1].data["status"] == "processing"
    # Handed once: the registration is over, the next job waits for a claim.
    later = await enqueue(engine, now=T0 + 2)
    assert (await engine.get(later.task_id)).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert await engine.stop_waiting("w1") == []


async def test_a_job_handed_at_its_enqueue_is_stored_as_if_enqueued_and_then_claimed(
    engine: RedisBackend, client: Redis
) -> None:
    """With the type's queue empty the enqueue writes the job as the worker's claim would
    leave it, never queued: the same hash, indexes, lease, counts and events as a job
    enqueued and then claimed, and the queue's fair-share clock at its tag."""
    p = "{" + engine.prefix + "}:"
    claimed = await enqueue(engine, now=T0 + 1)
    assert await engine.claim("w1", limit=1, now=T0 + 1, lease_s=45) != []
    waiting = asyncio.create_task(
        engine.wait_for_jobs(now=T0, timeout=10.0, types=["summarize"], worker_id="w1", lease_s=45)
    )
    await registered(client, engine, "w1")
    handed = await enqueue(engine, now=T0 + 1)
    assert [h.task_id for h in await asyncio.wait_for(waiting, 5)] == [handed.task_id]

    def comparable(fields: dict[bytes, bytes]) -> dict[bytes, object]:
        # (The lease's end is the same number, written by Python's repr or by Lua's %.17g.)
        lease = float(fields.pop(b"lease_expires_at"))
        return {k: v for k, v in fields.items() if k not in (b"_sq", b"_tg")} | {b"lease": lease}

    one, other = [await client.hgetall(p + "j:" + j.task_id) for j in (claimed, handed)]
    assert comparable(one) == comparable(other)
    for job in (claimed, handed):
        assert await client.zscore(p + "i:st:processing:summarize", job.task_id) is not None
        assert await client.zscore(p + "leases", job.task_id) == T0 + 1 + 45
    assert not await client.exists(p + "r:summarize", p + "i:st:queued:summarize")
    assert await client.hget(p + "qprio", "0") == b"0"
    assert await engine.tenant_in_flight("default") == 2
    tag = await client.hget(p + "j:" + handed.task_id, "_tg")
    assert await client.hget(p + "fair:summarize", "100") == tag
    got = [await engine.get(j.task_id) for j in (claimed, handed)]
    assert [(j.status, j.attempts, j.fence, j.worker_id) for j in got if j] == [
        (JobStatus.PROCESSING, 1, 1, "w1")
    ] * 2
    events = [await engine.events(j.task_id) for j in (claimed, handed)]
    assert [[(e.seq, e.type, e.data) for e in es] for es in events] == [
        [
            (1, "status", {"status": "queued"}),
            (2, "status", {"status": "processing", "attempt": 1, "worker_id": "w1"}),
        ]
    ] * 2


async def test_only_a_worker_of_the_jobs_type_is_handed_it(
    engine: RedisBackend, client: Redis
) -> None:
    waiting = asyncio.create_task(
        engine.wait_for_jobs(now=T0, timeout=10.0, types=["other"], worker_id="w1")
    )
    await registered(client, engine, "w1")
    job = await enqueue(engine, now=T0 + 1)
    assert (await engine.get(job.task_id)).status == JobStatus.QUEUED  # type: ignore[union-attr]
    waiting.cancel()
    assert await engine.stop_waiting("w1") == []


async def test_a_claim_ends_the_registration(engine: RedisBackend, client: Redis) -> None:
    first = await engine.wait_for_jobs(now=T0, timeout=0.05, types=["summarize"], worker_id="w1")
    assert first == []
    await registered(client, engine, "w1")  # still registered: the grace outlives the wait
    assert await engine.claim("w1", limit=5, now=T0, lease_s=30, types=["summarize"]) == []
    job = await enqueue(engine, now=T0 + 1)
    assert (await engine.get(job.task_id)).status == JobStatus.QUEUED  # type: ignore[union-attr]


async def test_a_lapsed_registration_is_handed_nothing(
    engine: RedisBackend, client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_waiting, "REGISTRATION_GRACE_S", 0.0)
    await engine.wait_for_jobs(now=T0, timeout=0.05, types=["summarize"], worker_id="dead")
    await asyncio.sleep(0.2)  # its registration (0.05 s) has lapsed: it may have died
    job = await enqueue(engine, now=T0 + 1)
    assert (await engine.get(job.task_id)).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert not await client.hexists("{" + engine.prefix + "}:idlew", "dead")


async def test_stop_waiting_returns_what_was_handed_and_not_taken(
    engine: RedisBackend, client: Redis
) -> None:
    waiting = asyncio.create_task(
        engine.wait_for_jobs(now=T0, timeout=10.0, types=["summarize"], worker_id="w1")
    )
    await registered(client, engine, "w1")
    waiting.cancel()  # the worker stops waiting; its registration stands until it says so
    await asyncio.gather(waiting, return_exceptions=True)
    job = await enqueue(engine, now=T0 + 1)
    stored = await engine.get(job.task_id)
    assert stored is not None and stored.status == JobStatus.PROCESSING  # handed to w1
    # Published before stop_waiting's unsubscribe, so it arrives before the confirmation.
    leftover = await engine.stop_waiting("w1")
    assert [j.task_id for j in leftover] == [job.task_id]
    await engine.finish(job.task_id, leftover[0].fence, Release(), now=T0 + 2)
    stored = await engine.get(job.task_id)
    assert stored is not None and stored.status == JobStatus.QUEUED and stored.attempts == 0


async def test_a_job_handed_after_the_wait_ended_still_reaches_the_worker(
    engine: RedisBackend, client: Redis
) -> None:
    handed: list[str] = []
    returned = await engine.wait_for_jobs(
        now=T0,
        timeout=0.05,
        types=["summarize"],
        worker_id="w1",
        on_handed=lambda job: handed.append(job.task_id),
    )
    assert returned == []
    await registered(client, engine, "w1")  # the registration outlives the wait
    job = await enqueue(engine, now=T0 + 1)
    for _ in range(500):
        if handed:
            break
        await asyncio.sleep(0.01)
    assert handed == [job.task_id]  # delivered, not parked where no wait may look
    assert await engine.stop_waiting("w1") == []


async def test_a_worker_that_is_not_listening_is_handed_nothing(
    engine: RedisBackend, client: Redis
) -> None:
    # Registered (as idle.lua does) but never subscribed: its connection dropped, say.
    await engine._run("idle", "ghost", '"ghost"', 30, 30, "summarize")
    await registered(client, engine, "ghost")
    job = await enqueue(engine, now=T0 + 1)
    assert (await engine.get(job.task_id)).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert not await client.hexists("{" + engine.prefix + "}:idlew", "ghost")


async def test_a_due_delayed_job_goes_first(engine: RedisBackend, client: Redis) -> None:
    # Due before the next enqueue, and ahead of it once a claim moves it in (priority 5).
    delayed = await enqueue(engine, now=T0, run_at=T0 + 1, priority=5)
    waiting = asyncio.create_task(
        engine.wait_for_jobs(now=T0, timeout=10.0, types=["summarize"], worker_id="w1")
    )
    await registered(client, engine, "w1")
    job = await enqueue(engine, now=T0 + 2)
    assert (await engine.get(job.task_id)).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert await asyncio.wait_for(waiting, 5) == []  # woken to claim instead
    claimed = await engine.claim("w1", limit=1, now=T0 + 2, lease_s=30, types=["summarize"])
    assert [c.task_id for c in claimed] == [delayed.task_id]


async def test_ready_work_of_its_other_types_goes_first(
    engine: RedisBackend, client: Redis
) -> None:
    other = await enqueue(engine, "other", now=T0)
    (running,) = await engine.claim("w9", limit=1, now=T0, lease_s=30, types=["other"])
    waiting = asyncio.create_task(
        engine.wait_for_jobs(now=T0, timeout=10.0, types=["other", "summarize"], worker_id="w1")
    )
    await registered(client, engine, "w1")
    # Back in its queue by a release (which wakes workers, it hands nothing off).
    await engine.finish(other.task_id, running.fence, Release(), now=T0 + 1)
    await asyncio.wait_for(waiting, 5)
    await registered(client, engine, "w1")  # the registration outlives the wait
    job = await enqueue(engine, now=T0 + 2)
    assert (await engine.get(job.task_id)).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert await engine.stop_waiting("w1") == []


@pytest.mark.parametrize("finishes", [1, 3], ids=["one finish", "a batch of finishes"])
async def test_a_finish_claiming_for_its_freed_slot_leaves_the_registration(
    engine: RedisBackend, client: Redis, finishes: int
) -> None:
    # w1 runs jobs in some slots and waits for work for the others; when its jobs end, their
    # finishes claim for the slots they free (nothing is queued): w1 still waits, and the next
    # job is handed to it rather than left for a wake-up and a claim.
    for _ in range(finishes):
        await enqueue(engine, now=T0)
    held = await engine.claim("w1", limit=finishes, now=T0, lease_s=30, types=["summarize"])
    assert len(held) == finishes
    waiting = asyncio.create_task(
        engine.wait_for_jobs(now=T0, timeout=10.0, types=["summarize"], worker_id="w1")
    )
    await registered(client, engine, "w1")
    refills = [NextClaim("w1", 30.0, ["summarize"]) for _ in held]
    await asyncio.gather(
        *(
            engine.finish(j.task_id, j.fence, Complete(1), now=T0 + 1, claimed=j, then_claim=r)
            for j, r in zip(held, refills, strict=True)
        )
    )
    assert [r.jobs for r in refills] == [[] for _ in held]
    assert await client.hexists("{" + engine.prefix + "}:idlew", "w1")
    job = await enqueue(engine, now=T0 + 2)
    handed = await asyncio.wait_for(waiting, 5)
    assert [h.task_id for h in handed] == [job.task_id]
    assert await engine.stop_waiting("w1") == []


def make_app(started: asyncio.Event, release: asyncio.Event) -> Backburner:
    app = redis_app()

    @app.task(max_attempts=1)
    async def hold(ctx: JobContext) -> str:
        started.set()
        await release.wait()
        return "held"

    @app.task(max_attempts=1)
    async def quick(ctx: JobContext) -> str:
        return "quick"

    return app


async def test_a_worker_runs_a_handed_job_without_claiming_it() -> None:
    app = make_app(asyncio.Event(), asyncio.Event())
    async with running_worker(app, concurrency=2) as worker:
        claims = count_claims(app)
        backend = app.backend
        assert isinstance(backend, RedisBackend)
        client = Redis.from_url(REDIS_TEST_URL)
        try:
            await registered(client, backend, worker.worker_id)
        finally:
            await client.aclose()
        job = await app.enqueue("quick")
        done = await app.wait(job.task_id, timeout=10)
        assert done.status == JobStatus.COMPLETED and done.result == "quick"
        assert done.history[-1].worker_id == worker.worker_id
        assert sum(claims) == 0  # it came by hand-off, not by a claim


async def test_a_worker_whose_task_is_cancelled_while_idle_is_handed_nothing_after() -> None:
    app = make_app(asyncio.Event(), asyncio.Event())
    idle = Worker(app, concurrency=2)
    cancelled = asyncio.create_task(idle.run())
    client = Redis.from_url(REDIS_TEST_URL)
    try:
        assert isinstance(app.backend, RedisBackend)
        await registered(client, app.backend, idle.worker_id)
        cancelled.cancel()
        await asyncio.wait_for(asyncio.gather(cancelled, return_exceptions=True), 10)
        assert cancelled.cancelled()
        assert not await client.hexists("{" + app.backend.prefix + "}:idlew", idle.worker_id)
    except BaseException:
        await app.close()  # (running_worker closes it otherwise)
        await drop_redis_keys(app.backend)
        raise
    finally:
        await client.aclose()
    async with running_worker(app, concurrency=2) as other:
        job = await app.enqueue("quick")
        done = await app.wait(job.task_id, timeout=10)
        assert done.status == JobStatus.COMPLETED
        assert [record.worker_id for record in done.history] == [other.worker_id]


async def test_a_worker_with_no_free_slot_hands_a_handed_job_back() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    app = make_app(started, release)
    try:
        async with running_worker(app, concurrency=1) as worker:
            await app.enqueue("hold")
            await asyncio.wait_for(started.wait(), 10)
            extra = await app.enqueue("quick")
            (claimed,) = await app.backend.claim(
                worker.worker_id, limit=1, now=app.clock.now(), lease_s=30, types=["quick"]
            )
            worker._take(claimed)  # as if handed while the only slot is busy
            for _ in range(500):
                stored = await app.get(extra.task_id)
                if stored.status == JobStatus.QUEUED:
                    break
                await asyncio.sleep(0.01)
            assert stored.status == JobStatus.QUEUED and stored.attempts == 0
            release.set()
            done = await app.wait(extra.task_id, timeout=10)
            assert done.status == JobStatus.COMPLETED
    finally:
        release.set()


async def test_a_lone_enqueue_goes_behind_a_ping(engine: RedisBackend, client: Redis) -> None:
    """So that Redis writes the job it hands to an idle worker before the producer's reply
    (redis_pipe.HAND_OFF_LEAD; test_redis_write_order shows why that works)."""
    enqueues = hand_off_commands(engine._scripts)
    async with client.monitor() as monitor, asyncio.timeout(10):
        await enqueue(engine, now=T0 + 1)
        sent: list[tuple[str, list[str]]] = []  # (client port, words): not a script's own
        while not sent or sent[-1][1][1:2] == [] or sent[-1][1][1] not in enqueues:
            command = await monitor.next_command()
            if command["client_type"] != "lua":
                sent.append((command["client_port"], command["command"].split()))
    port, script_call = sent[-1]
    assert [words for p, words in sent if p == port][-2:] == [["PING"], script_call]
