"""Redis calls of one loop turn batched into one script call, and a finish that claims next.

Enqueues and finishes made in the same event-loop turn reach Redis as one call of the script's
batch form; each caller still gets its own reply (a refusal is its caller's alone). A finish
given ``then_claim`` claims the job that takes the worker's freed slot in the same step; the
finishes of one batch share one claim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from backburner import JobContext
from backburner.backends.base import Complete, Fail, NextClaim, Release, RetryAt
from backburner.backends.redis import RedisBackend
from backburner.backends.redis_batch import ScriptBatcher
from backburner.backends.redis_link import Script
from backburner.backends.redis_scripts import _BATCH_MAIN
from backburner.errors import BackendConnectionError, BackendError, LeaseLostError
from backburner.hooks import Hooks
from backburner.models import Job, JobStatus

from ..conformance._support import T0, claim_one, enqueue, error, new_job
from ..conftest import REDIS_TEST_URL
from ._workers import count_claims, redis_app, running_worker

# Both event loops: the batcher sends what a loop turn gathered as that turn ends.
pytestmark = [pytest.mark.timeout(60), pytest.mark.both_event_loops]


async def _statuses(engine: RedisBackend, jobs: list[Job]) -> list[JobStatus | None]:
    """The stored status of each job (None: gone)."""
    stored = [await engine.get(job.task_id) for job in jobs]
    return [None if job is None else job.status for job in stored]


@pytest.fixture
def scripts_run(engine: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How many times each script went to Redis."""
    link = engine._conn()
    run = link.run
    counts: Counter[str] = Counter()

    async def counted(script: Script, *args: object, **kwargs: object) -> object:
        counts[script.name] += 1
        return await run(script, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(link, "run", counted)
    yield counts


async def test_enqueues_of_one_turn_go_in_one_batch(
    engine: RedisBackend, scripts_run: Counter[str]
) -> None:
    results = await asyncio.gather(*(engine.enqueue(new_job()) for _ in range(10)))
    assert all(created for _, created in results)
    # The first goes out at once, alone; the nine after it in the same turn go together.
    assert scripts_run == {"enqueue": 1, "enqueue_many": 1}
    for job, _ in results:
        stored = await engine.get(job.task_id)
        assert stored is not None and stored.status == JobStatus.QUEUED
    claimed = await engine.claim("w1", limit=20, now=T0, lease_s=30)
    assert [j.task_id for j in claimed] == [job.task_id for job, _ in results]  # FIFO kept


async def test_a_refusal_in_a_batch_is_its_callers_alone(engine: RedisBackend) -> None:
    taken = await enqueue(engine)
    again = dataclasses.replace(new_job(), task_id=taken.task_id)
    first, refused, last = await asyncio.gather(
        engine.enqueue(new_job()),
        engine.enqueue(again),
        engine.enqueue(new_job()),
        return_exceptions=True,
    )
    assert isinstance(refused, BackendError) and "already exists" in str(refused)
    for outcome in (first, last):
        assert not isinstance(outcome, BaseException)
        assert (await engine.get(outcome[0].task_id)) is not None


async def test_an_error_reply_in_a_batch_fails_only_its_caller(engine: RedisBackend) -> None:
    body = "if ARGV[2] == 'bad' then return redis.error_reply('bad input') end\nreturn ARGV[2]"
    single = Script("echo", body)
    batched = Script("echo_many", "local function one(ARGV)\n" + body + "\nend\n" + _BATCH_MAIN)
    batcher = ScriptBatcher(engine._conn, single, batched, ("k",), "p:")
    replies = await asyncio.gather(
        *(batcher.call((word,)) for word in ["a", "b", "bad", "c"]), return_exceptions=True
    )
    assert replies[:2] == [b"a", b"b"] and replies[3] == b"c"
    assert isinstance(replies[2], BackendError) and "bad input" in str(replies[2])


async def test_finish_claims_the_next_job_in_the_same_step(engine: RedisBackend) -> None:
    first = await enqueue(engine)
    claimed = await claim_one(engine, first.task_id)
    later = await enqueue(engine, now=T0 + 1)
    urgent = await enqueue(engine, now=T0 + 1, priority=5)
    other_type = await enqueue(engine, "translate", now=T0 + 1)
    refill = NextClaim("w1", 30.0, ["summarize"])
    now = 1_764_570_002.123457  # a real clock's: the lease must come back to the microsecond
    done = await engine.finish(
        claimed.task_id, claimed.fence, Complete(1), now=now, claimed=claimed, then_claim=refill
    )
    assert done.status == JobStatus.COMPLETED
    assert [j.task_id for j in refill.jobs] == [urgent.task_id]  # what a claim would take
    (next_job,) = refill.jobs
    assert next_job == await engine.get(urgent.task_id)
    assert next_job.status == JobStatus.PROCESSING and next_job.worker_id == "w1"
    assert next_job.lease_expires_at == now + 30.0 and next_job.attempts == 1
    assert next_job.started_at == now
    for waiting in (later, other_type):
        stored = await engine.get(waiting.task_id)
        assert stored is not None and stored.status == JobStatus.QUEUED


async def test_a_lost_finish_claims_nothing(engine: RedisBackend) -> None:
    first = await enqueue(engine)
    claimed = await claim_one(engine, first.task_id)
    waiting = await enqueue(engine)
    refill = NextClaim("w1", 30.0, None)
    with pytest.raises(LeaseLostError):
        await engine.finish(
            claimed.task_id, claimed.fence + 1, Complete(1), now=T0, then_claim=refill
        )
    assert refill.jobs == []
    stored = await engine.get(waiting.task_id)
    assert stored is not None and stored.status == JobStatus.QUEUED


async def test_finishes_of_one_batch_share_one_claim(
    engine: RedisBackend, scripts_run: Counter[str]
) -> None:
    running = [await enqueue(engine) for _ in range(4)]
    held = await engine.claim("w1", limit=4, now=T0, lease_s=30)
    assert [j.task_id for j in held] == [j.task_id for j in running]
    queued = [await enqueue(engine, now=T0 + 1) for _ in range(3)]
    refills = [NextClaim("w1", 30.0, ["summarize"]) for _ in held]
    nows = [T0 + 2 + i / 8 for i in range(len(held))]
    scripts_run.clear()
    await asyncio.gather(
        *(
            engine.finish(j.task_id, j.fence, Complete(1), now=now, claimed=j, then_claim=r)
            for j, r, now in zip(held, refills, nows, strict=True)
        )
    )
    assert scripts_run == {"finish": 1, "finish_many": 1}
    got = [j.task_id for r in refills for j in r.jobs]
    assert all(len(r.jobs) <= 1 for r in refills)
    assert sorted(got) == sorted(j.task_id for j in queued)  # each claimed once, none left
    for job in (j for r in refills for j in r.jobs):
        assert job == await engine.get(job.task_id)
        assert job.status == JobStatus.PROCESSING
    # The first finish went alone: its claim's lease runs from its own now. The batch's one
    # claim runs from the batch's last now.
    assert [j.lease_expires_at for j in refills[0].jobs] == [nows[0] + 30.0]
    assert {j.lease_expires_at for r in refills[1:] for j in r.jobs} == {nows[-1] + 30.0}


async def _claims_of_a_drain(jobs: int, concurrency: int) -> list[int]:
    """A worker of ``concurrency`` slots runs ``jobs`` quick jobs queued before it starts:
    how many jobs each of its own claims took (checked: every job completed, in its result)."""
    app = redis_app()

    @app.task(max_attempts=1)
    async def quick(ctx: JobContext, n: int) -> int:
        return n * 2

    queued = [await app.enqueue("quick", {"n": n}) for n in range(jobs)]
    claims = count_claims(app)
    async with running_worker(app, concurrency=concurrency):
        for n, job in enumerate(queued):
            done = await app.wait(job.task_id, timeout=20)
            assert done.status == JobStatus.COMPLETED and done.result == n * 2
    return claims


async def test_a_busy_worker_fills_its_slots_from_its_finishes() -> None:
    claims = await _claims_of_a_drain(60, concurrency=4)
    # Without refills the worker claims for every freed slot: 60 jobs, 4 at most a claim.
    assert sum(claims) <= 8, claims


async def test_a_worker_of_one_slot_claims_only_its_first_job() -> None:
    claims = await _claims_of_a_drain(30, concurrency=1)
    # Each outcome's write claims the next job: the last one's hooks have ended by then (when
    # its start decided, they had not, and every other job cost a claim of the worker's own).
    assert sum(claims) == 1, claims


async def test_finishes_stored_in_one_turn_all_hand_their_slots_a_refill() -> None:
    app = redis_app()
    releases = [asyncio.Event(), asyncio.Event()]

    @app.task(max_attempts=1)
    async def job(ctx: JobContext, n: int) -> int:
        if n >= 4:
            await releases[n // 4 - 1].wait()
        return n * 2

    # The first 4 finishes get their replies in one loop turn, as one batch's do: each frees
    # its slot and starts its refilled job before any of their tasks' done callbacks run.
    finish = app.backend.finish
    held: list[str] = []
    all_in = asyncio.Event()

    async def together(*args: Any, **kwargs: Any) -> Job:
        stored = await finish(*args, **kwargs)
        if len(held) < 4:
            held.append(stored.task_id)
            if len(held) == 4:  # (set in a turn of its own, so that all 4 wait for it)
                asyncio.get_running_loop().call_soon(all_in.set)
            await all_in.wait()
        return stored

    app.backend.finish = together  # type: ignore[method-assign]
    # 4 quick jobs; 4 that their finishes claim, held until released; 4 more that those
    # claim with theirs, held too: no job after the first 4 needs a claim of the worker's own.
    jobs = [await app.enqueue("job", {"n": n}) for n in range(12)]
    claims = count_claims(app)
    async with running_worker(app, concurrency=4) as worker:
        for generation, release in enumerate(releases):
            first = 4 * (generation + 1)
            for _ in range(2000):  # until this generation holds every slot
                if {a.job.task_id for a in worker.running.values()} == {
                    j.task_id for j in jobs[first : first + 4]
                }:
                    break
                await asyncio.sleep(0.005)
            else:
                pytest.fail(f"jobs {first}..{first + 3} never held every slot")
            release.set()
        for n, queued in enumerate(jobs):
            done = await app.wait(queued.task_id, timeout=20)
            assert done.status == JobStatus.COMPLETED and done.result == n * 2
    assert len(held) == 4 and sum(claims) == 4, claims


async def test_a_stopping_worker_claims_nothing_with_its_last_outcomes() -> None:
    app = redis_app()
    started, release = asyncio.Event(), asyncio.Event()

    @app.task(max_attempts=1)
    async def hold(ctx: JobContext) -> str:
        started.set()
        await release.wait()
        return "held"

    held = await app.enqueue("hold")
    try:
        async with running_worker(app, concurrency=1) as worker:
            await asyncio.wait_for(started.wait(), 10)
            waiting = await app.enqueue("hold")
            worker.shutdown()
            release.set()
            for _ in range(1000):  # until its job is stored: the worker then stops
                if (await app.get(held.task_id)).status == JobStatus.COMPLETED:
                    break
                await asyncio.sleep(0.01)
            assert (await app.get(held.task_id)).status == JobStatus.COMPLETED
            left = await app.get(waiting.task_id)
            # Never claimed (not claimed and handed back): no attempt, no history.
            assert left.status == JobStatus.QUEUED and left.history == []
    finally:
        release.set()


async def _echo_batcher(
    engine: RedisBackend, max_batch: int, *, eager: bool = False
) -> ScriptBatcher:
    """Appends its argument to the list {p}:echo and returns it; 'boom' is a Lua error. Its
    scripts are loaded first, as connect() loads the backend's."""
    body = (
        "if ARGV[2] == 'boom' then redis.call('HSET', ARGV[1] .. 'echo') end\n"
        "redis.call('RPUSH', ARGV[1] .. 'echo', ARGV[2])\nreturn ARGV[2]"
    )
    batched = "local function one(ARGV)\n" + body + "\nend\n" + _BATCH_MAIN
    for source in (body, batched):
        await engine._conn().call("SCRIPT", "LOAD", source)
    return ScriptBatcher(
        engine._conn,
        Script("echo", body),
        Script("echo_many", batched),
        (engine._tag_key,),
        engine._p,
        max_batch=max_batch,
        eager=eager,
    )


async def test_full_batches_leave_at_once_and_each_call_gets_its_reply(
    engine: RedisBackend, client: Redis, scripts_run: Counter[str]
) -> None:
    batcher = await _echo_batcher(engine, max_batch=3)
    words = [str(n) for n in range(11)]
    assert await asyncio.gather(*(batcher.call((w,)) for w in words)) == [w.encode() for w in words]
    # One alone, then 3 + 3 + 3 + 1: the call after a full batch joins the next batch.
    assert scripts_run == {"echo": 1, "echo_many": 4}
    stored = await client.lrange(engine._p + "echo", 0, -1)
    assert sorted(stored) == sorted(w.encode() for w in words)


async def test_a_batch_is_written_as_its_turn_closes_it_not_a_turn_later(
    engine: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed batch (full, or at its turn's end) is on its way to Redis before the loop runs
    anything else: a task's first step would send it a turn later, behind every other task's
    step, and a worker's finishes would leave in clumps that Redis and the worker take turns
    on. Checked from inside the flush, with a blocking client: the loop cannot turn meanwhile."""
    batcher = await _echo_batcher(engine, max_batch=3)
    link = engine._conn()
    await asyncio.gather(link.call("PING"), link.call("PING"))
    assert all(lane.pipe is not None for lane in link._lanes)  # both connections open
    key = engine._p + "echo"
    seen: list[tuple[bool, list[bytes]]] = []
    flush = batcher._flush

    def flush_then_look(*, turn_over: bool = True) -> None:
        gathered = [args[0] for args, _ in batcher._batch or ()]
        flush(turn_over=turn_over)
        if not gathered:
            return
        with SyncRedis.from_url(REDIS_TEST_URL) as blocking:
            deadline = time.monotonic() + 10
            while not set(gathered) <= set(blocking.lrange(key, 0, -1)):
                if time.monotonic() > deadline:
                    pytest.fail(f"batch {gathered} not in Redis when its flush returned")
                time.sleep(0.005)  # (blocking on purpose: the loop must not turn)
        seen.append((turn_over, gathered))

    monkeypatch.setattr(batcher, "_flush", flush_then_look)
    first = asyncio.ensure_future(batcher.call((b"a",)))
    await asyncio.sleep(0)  # sent alone; its reply is still to come
    words = [b"b", b"c", b"d", b"e"]
    assert await asyncio.gather(first, *(batcher.call((w,)) for w in words)) == [b"a", *words]
    # b, c, d fill a batch, written by the call that fills it; e's leaves as its turn ends.
    assert seen == [(False, [b"b", b"c", b"d"]), (True, [b"e"])]


@pytest.mark.parametrize("eager", [False, True], ids=["gathering", "eager"])
async def test_a_call_cancelled_after_its_turn_closed_the_batch_runs_only_if_it_was_written(
    engine: RedisBackend, client: Redis, eager: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    batcher = await _echo_batcher(engine, max_batch=10, eager=eager)
    link = engine._conn()
    await asyncio.gather(link.call("PING"), link.call("PING"))
    assert all(lane.pipe is not None for lane in link._lanes)  # both connections open
    first = asyncio.ensure_future(batcher.call(("a",)))
    await asyncio.sleep(0)  # sent alone; its reply is still to come
    behind = [asyncio.ensure_future(batcher.call((w,))) for w in ["b", "c"]]
    flush = batcher._flush

    def flush_then_cancel(*, turn_over: bool = True) -> None:
        flush(turn_over=turn_over)
        behind[1].cancel()  # after its batch closed, before the batch's task first runs

    monkeypatch.setattr(batcher, "_flush", flush_then_cancel)
    done = await asyncio.gather(first, *behind, return_exceptions=True)
    assert done[:2] == [b"a", b"b"] and isinstance(done[2], asyncio.CancelledError)
    assert await batcher.call(("d",)) == b"d"
    # A gathering batcher wrote the batch as its turn closed it: c ran all the same. An
    # eager one's batch had not left: c was not sent.
    ran = [b"a", b"b", b"c", b"d"] if not eager else [b"a", b"b", b"d"]
    assert sorted(await client.lrange(engine._p + "echo", 0, -1)) == ran


@pytest.mark.parametrize("eager", [False, True], ids=["gathering", "eager"])
async def test_a_batch_that_cannot_be_sent_fails_its_callers_and_nothing_else(
    engine: RedisBackend, client: Redis, eager: bool
) -> None:
    batcher = await _echo_batcher(engine, max_batch=10, eager=eager)
    first = asyncio.ensure_future(batcher.call(("a",)))
    await asyncio.sleep(0)  # sent alone; its reply is still to come
    # Behind it, in one turn (they gather behind a lone call, eager or not): a batch with an
    # argument RESP has no form for, refused before a byte of it is written.
    bad: Any = object()
    behind = [batcher.call(("b",)), batcher.call(("c",)), batcher.call((bad,))]
    done = await asyncio.wait_for(asyncio.gather(*behind, return_exceptions=True), 10)
    assert await first == b"a"
    assert [type(d) for d in done] == [TypeError, TypeError, TypeError]
    assert await batcher.call(("d",)) == b"d"
    assert await client.lrange(engine._p + "echo", 0, -1) == [b"a", b"d"]


@pytest.mark.parametrize("eager", [False, True], ids=["gathering", "eager"])
async def test_a_lone_caller_goes_alone_and_a_call_behind_one_in_flight_waits_unless_eager(
    engine: RedisBackend, scripts_run: Counter[str], eager: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    batcher = await _echo_batcher(engine, max_batch=10, eager=eager)
    turns_closed = 0
    flush = batcher._flush

    def counted(*, turn_over: bool = True) -> None:
        nonlocal turns_closed
        turns_closed += turn_over
        flush(turn_over=turn_over)

    batcher._flush = counted  # type: ignore[method-assign]
    for word in ("a", "b", "c"):  # one after the other: each alone
        assert await batcher.call((word,)) == word.encode()
    # A lone call leaves no batch to close, eager or not: its loop turn ends as it would.
    assert scripts_run == {"echo": 3} and turns_closed == 0
    # From here replies are held back until the gate opens: what is in flight stays in flight.
    gate = asyncio.Event()
    link = engine._conn()
    run = link.run

    async def held(*args: Any, **kwargs: Any) -> Any:
        reply = await run(*args, **kwargs)
        await gate.wait()
        return reply

    monkeypatch.setattr(link, "run", held)
    first = asyncio.create_task(batcher.call(("d",)))
    await asyncio.sleep(0)  # sent alone; its reply is still to come
    second = asyncio.create_task(batcher.call(("e",)))  # a turn later, behind it
    third = asyncio.create_task(batcher.call(("f",)))  # and in the same turn as that one
    while not batcher._sending:  # e and f leave together when their turn ends
        await asyncio.sleep(0)
    fourth = asyncio.create_task(batcher.call(("g",)))  # a new turn, behind that batch
    fifth = asyncio.create_task(batcher.call(("h",)))
    await asyncio.sleep(0)
    gate.set()
    assert [await t for t in (first, second, third, fourth, fifth)] == [
        b"d",
        b"e",
        b"f",
        b"g",
        b"h",
    ]
    # Behind a lone call the turn's calls gather, eager or not (they leave after it, in order).
    # Behind a batch, an eager batcher sends the turn's first call at once; the rest gather.
    if eager:
        assert scripts_run == {"echo": 5, "echo_many": 2} and turns_closed == 2
    else:
        assert scripts_run == {"echo": 4, "echo_many": 2} and turns_closed == 2


async def test_a_lua_error_fails_its_own_call_and_leaves_the_others_applied(
    engine: RedisBackend, client: Redis
) -> None:
    batcher = await _echo_batcher(engine, max_batch=10)
    replies = await asyncio.gather(
        *(batcher.call((w,)) for w in ["a", "b", "boom", "c"]), return_exceptions=True
    )
    assert replies[:2] == [b"a", b"b"] and replies[3] == b"c"
    assert isinstance(replies[2], BackendError)
    assert await client.lrange(engine._p + "echo", 0, -1) == [b"a", b"b", b"c"]


async def test_a_batch_reply_of_the_wrong_shape_fails_its_callers(engine: RedisBackend) -> None:
    """A batch answered with fewer replies than calls (a script of another release, say)
    fails every caller of that batch with a BackendError: none is left waiting."""
    body = "return ARGV[2]"
    batched = "return {'one reply for them all'}"
    for source in (body, batched):
        await engine._conn().call("SCRIPT", "LOAD", source)
    batcher = ScriptBatcher(
        engine._conn, Script("echo", body), Script("echo_many", batched), (), engine._p
    )
    calls = (batcher.call((w,)) for w in ["a", "b", "c"])
    replies = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    assert replies[0] == b"a"  # the first call of the turn went alone
    for reply in replies[1:]:
        assert isinstance(reply, BackendError) and "a batch of 2 calls" in str(reply), reply


async def test_a_lua_error_in_a_finish_batch_fails_that_finish_alone(
    engine: RedisBackend, client: Redis, scripts_run: Counter[str]
) -> None:
    """finish_many runs each finish under its own pcall: a finish that errors half-way (here
    its event stream is not a stream: a damaged store) fails its caller; the others apply."""
    jobs = [await enqueue(engine) for _ in range(3)]
    held = await engine.claim("w1", limit=3, now=T0, lease_s=30)
    assert [j.task_id for j in held] == [j.task_id for j in jobs]
    # A progress event gives the job its stream: its status events go there from then on.
    await engine.append_event(held[1].task_id, held[1].fence, "progress", {}, now=T0)
    await client.set(engine._p + "e:" + held[1].task_id, "not a stream")
    scripts_run.clear()
    done = await asyncio.gather(
        *(engine.finish(j.task_id, j.fence, Complete(1), now=T0 + 1) for j in held),
        return_exceptions=True,
    )
    assert scripts_run == {"finish": 1, "finish_many": 1}  # the 2nd and 3rd in one batch
    assert isinstance(done[1], BackendError) and "WRONGTYPE" in str(done[1]), done[1]
    for finished in (done[0], done[2]):
        assert isinstance(finished, Job) and finished.status == JobStatus.COMPLETED
    third = await engine.get(held[2].task_id)
    assert third is not None and third.status == JobStatus.COMPLETED
    completed, processing = (engine._p + f"i:st:{s}:summarize" for s in ("completed", "processing"))
    assert await client.zscore(completed, held[2].task_id) is not None
    assert await client.zscore(processing, held[2].task_id) is None


async def test_a_finish_batch_moves_every_index_entry_and_count_as_finishes_alone(
    engine: RedisBackend, client: Redis, scripts_run: Counter[str]
) -> None:
    """finish_many gathers its finishes' index moves and counters and makes them after its
    last finish, one command per key: the store must end as if each finish ran alone."""
    jobs = [await enqueue(engine, tenant="acme") for _ in range(6)]
    held = await engine.claim("w1", limit=6, now=T0, lease_s=30)
    assert [j.task_id for j in held] == [j.task_id for j in jobs]
    now = T0 + 1
    outcomes = [
        Complete(1),  # goes alone: nothing in flight
        Complete(2),
        Fail(error(), ttl_s=600),
        RetryAt(error(), run_at=now),
        Release(),
        Complete(3),
    ]
    scripts_run.clear()
    await asyncio.gather(
        *(
            engine.finish(j.task_id, j.fence, outcome, now=now, claimed=j)
            for j, outcome in zip(held, outcomes, strict=True)
        )
    )
    assert scripts_run == {"finish": 1, "finish_many": 1}
    ids = [j.task_id for j in held]
    p = engine._p

    async def members(key: str) -> set[str]:
        return {m.decode() for m in await client.zrange(p + key, 0, -1)}

    completed, failed, queued = {ids[0], ids[1], ids[5]}, {ids[2]}, {ids[3], ids[4]}
    for status, expected in [
        ("completed", completed),
        ("failed", failed),
        ("queued", queued),
        ("processing", set()),
    ]:
        assert await members(f"i:st:{status}:summarize") == expected, status
    assert await members("leases") == set()
    expiring = dict(await client.zrange(p + "expiring", 0, -1, withscores=True))
    assert expiring == {
        **{i.encode(): now + 3600.0 for i in completed},
        ids[2].encode(): now + 600,
    }
    assert await engine.tenant_in_flight("acme") == 2  # the retried and the released job
    assert await client.hget(p + "qprio", "0") == b"2"
    again = await engine.claim("w2", limit=6, now=now, lease_s=30)
    assert {j.task_id for j in again} == queued
    assert await _statuses(engine, held) == [
        "completed",
        "completed",
        "failed",
        "processing",
        "processing",
        "completed",
    ]


async def test_a_finish_batch_drops_the_counts_it_brings_to_zero(
    engine: RedisBackend, client: Redis, scripts_run: Counter[str]
) -> None:
    """A tenant's (or a parent's) count summed over a batch drops its field at zero, as each
    finish alone would: a field left at 0 or below would let the tenant past its quota."""
    alone = await enqueue(engine, tenant="other")  # the first finish goes alone: this one's
    parent = await enqueue(engine, tenant="solo")
    first = await engine.claim("w1", limit=2, now=T0, lease_s=30)
    assert [j.task_id for j in first] == [alone.task_id, parent.task_id]
    children = [await enqueue(engine, parent_id=parent.task_id) for _ in range(3)]
    jobs = [parent, *children]
    assert await client.hget(engine._p + "open", parent.task_id) == b"3"
    assert await engine.tenant_in_flight("solo") == 1
    held = await engine.claim("w1", limit=3, now=T0, lease_s=30)
    assert {j.task_id for j in held} == {j.task_id for j in children}
    running = [*first, *held]
    scripts_run.clear()
    await asyncio.gather(
        *(engine.finish(j.task_id, j.fence, Complete(1), now=T0 + 1, claimed=j) for j in running)
    )
    assert scripts_run == {"finish": 1, "finish_many": 1}
    assert not await client.hexists(engine._p + "open", parent.task_id)
    assert not await client.hexists(engine._p + "inflight", "solo")
    assert not await engine.has_open_children(parent.task_id)
    assert await _statuses(engine, jobs) == [JobStatus.COMPLETED] * len(jobs)


async def test_a_batch_claims_back_its_own_retries_after_moving_their_index_entries(
    engine: RedisBackend, client: Redis, scripts_run: Counter[str]
) -> None:
    """A retry due now, in a batch whose finishes ask for the next claim, may be claimed back
    by the same call: its gathered index moves (into queued) are made before the claim moves
    it on (into processing), or the job would be left listed as queued while it runs."""
    jobs = [await enqueue(engine) for _ in range(3)]
    held = await engine.claim("w1", limit=3, now=T0, lease_s=30)
    assert [j.task_id for j in held] == [j.task_id for j in jobs]
    now = T0 + 1
    refills = [NextClaim("w1", 30.0, ["summarize"]) for _ in held]
    scripts_run.clear()
    await asyncio.gather(
        *(
            engine.finish(j.task_id, j.fence, RetryAt(error(), run_at=now), now=now, then_claim=r)
            for j, r in zip(held, refills, strict=True)
        )
    )
    assert scripts_run == {"finish": 1, "finish_many": 1}
    again = [j for r in refills for j in r.jobs]
    assert sorted(j.task_id for j in again) == sorted(j.task_id for j in held)
    ids = {j.task_id.encode() for j in held}
    assert set(await client.zrange(engine._p + "i:st:processing:summarize", 0, -1)) == ids
    assert await client.zrange(engine._p + "i:st:queued:summarize", 0, -1) == []
    assert await _statuses(engine, again) == [JobStatus.PROCESSING] * len(again)


async def test_a_gathered_index_write_that_fails_fails_alone(
    engine: RedisBackend, client: Redis, scripts_run: Counter[str]
) -> None:
    """A batch's gathered writes go after its finishes: one that fails (its key is not a sorted
    set: a damaged store) leaves the finishes applied and answered, and the other writes made."""
    jobs = [await enqueue(engine) for _ in range(3)]
    held = await engine.claim("w1", limit=3, now=T0, lease_s=30)
    assert [j.task_id for j in held] == [j.task_id for j in jobs]
    await client.set(engine._p + "i:st:completed:summarize", "not a sorted set")
    scripts_run.clear()
    done = await asyncio.gather(
        *(engine.finish(j.task_id, j.fence, Complete(1), now=T0 + 1, claimed=j) for j in held),
        return_exceptions=True,
    )
    assert scripts_run == {"finish": 1, "finish_many": 1}
    # The first went alone and wrote at once: its caller hears of it, as before batching.
    assert isinstance(done[0], BackendError) and "WRONGTYPE" in str(done[0]), done[0]
    for finished in done[1:]:
        assert isinstance(finished, Job) and finished.status == JobStatus.COMPLETED, finished
    batched = {j.task_id.encode() for j in held[1:]}
    assert set(await client.zrange(engine._p + "expiring", 0, -1)) == batched
    assert await engine.tenant_in_flight("default") == 1  # the lone one stopped before its own
    processing = set(await client.zrange(engine._p + "i:st:processing:summarize", 0, -1))
    assert processing.isdisjoint(batched)
    assert set(await client.zrange(engine._p + "leases", 0, -1)).isdisjoint(batched)
    assert await client.get(engine._p + "i:st:completed:summarize") == b"not a sorted set"


async def test_a_call_cancelled_before_its_batch_leaves_is_not_sent(
    engine: RedisBackend, client: Redis
) -> None:
    batcher = await _echo_batcher(engine, max_batch=10)
    calls = [asyncio.ensure_future(batcher.call((w,))) for w in ["a", "b", "c"]]
    await asyncio.sleep(0)  # each call has joined the turn's batch (the first went alone)
    calls[1].cancel()
    done = await asyncio.gather(*calls, return_exceptions=True)
    assert done[0] == b"a" and done[2] == b"c"
    assert isinstance(done[1], asyncio.CancelledError)
    assert await client.lrange(engine._p + "echo", 0, -1) == [b"a", b"c"]


async def test_a_batch_cancelled_before_its_first_step_fails_its_callers(
    engine: RedisBackend, client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task cancelled before it first runs never runs its body (no try/finally of its own):
    # as when the loop shuts down right after a turn gathered calls. The batch was written as
    # its turn closed it, before that task existed: it ran, and its callers are told it may
    # have. Its reply, when it comes, is nobody's: the calls after it get their own.
    batcher = await _echo_batcher(engine, max_batch=10)
    link = engine._conn()
    # Both connections open (the second opens for a command sent behind one in flight), so
    # the batch can be written whichever the link picks: a connection still to be opened
    # would take the task's first step.
    await asyncio.gather(link.call("PING"), link.call("PING"))
    assert all(lane.pipe is not None for lane in link._lanes)
    first = asyncio.ensure_future(batcher.call(("a",)))
    await asyncio.sleep(0)  # sent alone; its reply is still to come
    create_task = asyncio.create_task

    def created_cancelled(coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = create_task(coro, **kwargs)
        task.cancel()
        return task

    monkeypatch.setattr(asyncio, "create_task", created_cancelled)
    behind = [asyncio.ensure_future(batcher.call((w,))) for w in ["b", "c"]]
    done = await asyncio.wait_for(asyncio.gather(*behind, return_exceptions=True), 10)
    monkeypatch.undo()
    assert [type(d) for d in done] == [BackendConnectionError, BackendConnectionError]
    assert "it may have run" in str(done[0])
    assert await first == b"a"
    assert not batcher._sending
    assert await batcher.call(("d",)) == b"d"
    # (Sorted: b and c went on one connection, d on the other.)
    assert sorted(await client.lrange(engine._p + "echo", 0, -1)) == [b"a", b"b", b"c", b"d"]


async def test_a_retry_claimed_back_at_once_is_reported_as_queued(engine: RedisBackend) -> None:
    job = await enqueue(engine)
    claimed = await claim_one(engine, job.task_id)
    refill = NextClaim("w1", 30.0, None)
    retried = await engine.finish(
        claimed.task_id,
        claimed.fence,
        RetryAt(error(), run_at=T0 + 1),
        now=T0 + 1,
        claimed=claimed,
        then_claim=refill,
    )
    # The reply is the job as the retry left it, though the same step claimed it back.
    assert retried.status == JobStatus.QUEUED and retried.fence == claimed.fence
    (again,) = refill.jobs
    assert again.task_id == job.task_id and again.fence == claimed.fence + 1
    assert again.status == JobStatus.PROCESSING


async def test_a_claimed_job_starts_before_the_finished_jobs_hooks_end() -> None:
    app = redis_app()
    hook_entered, hook_release, second_started = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class SlowHook(Hooks):
        async def on_complete(self, job: Job) -> None:
            if job.result == "first":
                hook_entered.set()
                await hook_release.wait()

    app.hooks.hooks.append(SlowHook())

    order: list[str] = []

    @app.task(max_attempts=1)
    async def step(ctx: JobContext, name: str) -> str:
        order.append(name)
        if name == "second":
            second_started.set()
        return name

    first = await app.enqueue("step", {"name": "first"})
    second = await app.enqueue("step", {"name": "second"})
    try:
        async with running_worker(app, concurrency=1):
            await asyncio.wait_for(hook_entered.wait(), 10)
            # One slot: the second job runs while the first's hook still holds on.
            await asyncio.wait_for(second_started.wait(), 10)
            assert order == ["first", "second"] and not hook_release.is_set()
            assert (await app.wait(second.task_id, timeout=10)).status == JobStatus.COMPLETED
            hook_release.set()
            assert (await app.get(first.task_id)).status == JobStatus.COMPLETED
    finally:
        hook_release.set()


async def test_a_lease_check_does_not_cancel_an_outcome_being_written() -> None:
    app = redis_app()

    @app.task(max_attempts=1)
    async def quick(ctx: JobContext) -> str:
        return "done"

    job = await app.enqueue("quick")
    backend = app.backend
    finish = backend.finish
    writing, go_on = asyncio.Event(), asyncio.Event()

    async def slow_finish(*args: object, **kwargs: object) -> object:
        writing.set()
        await go_on.wait()
        return await finish(*args, **kwargs)  # type: ignore[arg-type]

    backend.finish = slow_finish  # type: ignore[method-assign]
    try:
        async with running_worker(app, concurrency=1) as worker:
            await asyncio.wait_for(writing.wait(), 10)
            (attempt,) = worker.running.values()
            # What a heartbeat that found the lease gone (the write landed first) would do.
            assert worker.cancel_local(job.task_id, attempt.job.fence, "lease_lost") is False
            go_on.set()
            done = await app.wait(job.task_id, timeout=10)
            assert done.status == JobStatus.COMPLETED and done.result == "done"
    finally:
        go_on.set()


async def test_slow_hooks_hold_slots_once_as_many_run_as_the_concurrency() -> None:
    app = redis_app()
    release, entered = asyncio.Event(), asyncio.Event()
    in_hooks: list[str] = []

    class SlowHook(Hooks):
        async def on_complete(self, job: Job) -> None:
            in_hooks.append(job.result)
            entered.set()
            await release.wait()

    app.hooks.hooks.append(SlowHook())

    @app.task(max_attempts=1)
    async def step(ctx: JobContext, name: str) -> str:
        return name

    jobs = [await app.enqueue("step", {"name": name}) for name in ("a", "b", "c")]
    try:
        async with running_worker(app, concurrency=1):
            for _ in range(1000):  # a's hook runs beside b; b's, past the cap, holds the slot
                if in_hooks == ["a", "b"]:
                    break
                await asyncio.sleep(0.01)
            assert in_hooks == ["a", "b"]
            await asyncio.sleep(0.2)  # (what must not happen: c starting)
            # Nor claimed by b's outcome and handed back: b's write knew a's hook held on.
            left = await app.get(jobs[2].task_id)
            assert left.status == JobStatus.QUEUED and left.history == []
            release.set()
            done = await app.wait(jobs[2].task_id, timeout=10)
            assert done.status == JobStatus.COMPLETED
    finally:
        release.set()
