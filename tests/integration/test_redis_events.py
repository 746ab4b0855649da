"""Where the Redis backend keeps a job's events: a job gets its stream (``e:<id>``) only when it
needs one, and its claims and outcomes are made from its attempts' records until then
(docs/redis.md, "Events"). What every backend promises about events is in the conformance
suite; these check the layout and that waiting for a job without a stream still wakes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from redis.asyncio import Redis

from backburner.backends.base import Complete, Fail, RetryAt
from backburner.backends.redis import RedisBackend
from backburner.models import Job

from ..conformance._support import T0, claim_one, enqueue, error

GRACE = 3600  # redis_lua/prelude.lua: keys outlive expires_at by this much


def keys(engine: RedisBackend, task_id: str) -> tuple[str, str]:
    p = "{" + engine.prefix + "}:"
    return p + "j:" + task_id, p + "e:" + task_id


async def test_claims_and_outcomes_alone_make_no_stream(
    engine: RedisBackend, client: Redis
) -> None:
    done = await enqueue(engine, now=T0)
    retried = await enqueue(engine, now=T0, max_attempts=2)
    for job, outcomes in [
        (done, [Complete({"ok": True})]),
        (retried, [RetryAt(error(), run_at=T0 + 2), Fail(error(retryable=False), ttl_s=60)]),
    ]:
        for k, outcome in enumerate(outcomes):
            claimed = await claim_one(engine, job.task_id, now=T0 + 2 * k + 2)
            await engine.finish(job.task_id, claimed.fence, outcome, now=T0 + 2 * k + 3)
        j, e = keys(engine, job.task_id)
        assert await client.exists(e) == 0, job.task_id
        assert await client.hget(j, "_es") == b"0"
    assert [ev.type for ev in await engine.events(retried.task_id)] == [
        "status",  # queued
        "status",  # processing
        "attempt_failed",
        "status",  # queued again
        "status",  # processing
        "attempt_failed",
        "status",  # failed
    ]
    assert (await engine.events(done.task_id))[-1].data == {
        "status": "completed",
        "result": {"ok": True},
    }


async def test_an_event_of_its_own_makes_the_stream_and_later_events_go_there(
    engine: RedisBackend, client: Redis
) -> None:
    job = await enqueue(engine, now=T0)
    claimed = await claim_one(engine, job.task_id, now=T0 + 1)
    j, e = keys(engine, job.task_id)
    assert await client.exists(e) == 0
    await engine.append_event(job.task_id, claimed.fence, "token", {"t": "a"}, now=T0 + 2)
    assert await client.hget(j, "_es") == b"1"
    await engine.finish(job.task_id, claimed.fence, Complete(1), now=T0 + 3)
    # The claim (seq 2) stays in the record; the token and the outcome are in the stream.
    assert [entry[0] for entry in await client.xrange(e)] == [b"3-0", b"4-0"]
    assert [ev.seq for ev in await engine.events(job.task_id)] == [1, 2, 3, 4]
    assert 60 <= await client.ttl(e) <= await client.ttl(j)  # it expires with the job


async def test_a_job_of_an_earlier_release_keeps_every_event_in_its_stream(
    engine: RedisBackend, client: Redis
) -> None:
    """A hash without ``_es`` was written by a release that streamed every event after the
    first: its next claim and outcome go to its stream as before."""
    job = await enqueue(engine, now=T0)
    j, e = keys(engine, job.task_id)
    await client.hdel(j, "_es")
    claimed = await claim_one(engine, job.task_id, now=T0 + 1)
    await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 2)
    assert [entry[0] for entry in await client.xrange(e)] == [b"2-0", b"3-0"]
    assert await client.hexists(j, "_es") is False
    events = await engine.events(job.task_id)
    assert [(ev.seq, ev.data["status"]) for ev in events] == [
        (1, "queued"),
        (2, "processing"),
        (3, "completed"),
    ]


async def test_waiting_for_a_job_without_a_stream_wakes_at_its_claim_and_its_outcome(
    engine: RedisBackend, client: Redis
) -> None:
    job = await enqueue(engine, now=T0)
    j, e = keys(engine, job.task_id)
    assert await engine.wait_for_events({job.task_id: 0}, timeout=0) == {job.task_id: 1}
    # Being waited for gave it an empty stream (XREAD BLOCK watches streams), and its next
    # events go there.
    assert await client.hget(j, "_es") == b"1"
    assert await client.exists(e) == 1 and await client.xlen(e) == 0

    async def woken_by(after: int, action: Awaitable[object]) -> object:
        waiting = asyncio.create_task(engine.wait_for_events({job.task_id: after}, timeout=30))
        # Until its XREAD BLOCK is open, so that the event cannot come before it.
        deadline = time.monotonic() + 10
        while not await _blocked(client):
            assert time.monotonic() < deadline, "the watcher never blocked"
            await asyncio.sleep(0.01)
        started = time.monotonic()
        done = await action
        assert await asyncio.wait_for(waiting, 10) == {job.task_id: after + 1}
        assert time.monotonic() - started < 5  # woken by the event, not by the timeout
        return done

    claimed = await woken_by(1, claim_one(engine, job.task_id, now=T0 + 1))
    assert isinstance(claimed, Job)
    await woken_by(2, engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 2))
    assert [entry[0] for entry in await client.xrange(e)] == [b"2-0", b"3-0"]
    assert [ev.data["status"] for ev in await engine.events(job.task_id)] == [
        "queued",
        "processing",
        "completed",
    ]


async def test_a_stream_made_for_a_finished_job_expires_with_it(
    engine: RedisBackend, client: Redis
) -> None:
    job = await enqueue(engine, now=T0)
    claimed = await claim_one(engine, job.task_id, now=T0 + 1)
    await engine.finish(job.task_id, claimed.fence, Fail(error(), ttl_s=900), now=T0 + 2)
    j, e = keys(engine, job.task_id)
    assert await engine.wait_for_events({job.task_id: 3}, timeout=0) == {job.task_id: 4}
    assert await client.exists(e) == 1
    job_ttl, stream_ttl = await client.pttl(j), await client.pttl(e)
    assert 0 < stream_ttl <= job_ttl
    assert job_ttl - stream_ttl < 5_000
    assert stream_ttl >= (900 + GRACE - 5) * 1000
    # Made twice, it is the same empty stream; the events still read back whole.
    await engine.wait_for_events({job.task_id: 3}, timeout=0)
    assert await client.xlen(e) == 0
    assert [ev.seq for ev in await engine.events(job.task_id)] == [1, 2, 3, 4]


async def test_a_completed_job_without_events_of_its_own_costs_under_2_75_kilobytes(
    engine: RedisBackend, client: Redis
) -> None:
    """Its hash, its input and its share of the indexes, by MEMORY USAGE of every element:
    2,415 bytes with a 200-byte input and result on Redis 7.0's default configuration (a stream
    of one entry alone counts 4.7 KB). The result, longer than hash-max-listpack-value (64),
    makes the hash a hashtable: 1,704 bytes of it, with 488 for the spec and 223 for the job's
    share of the indexes (321 while a job was in three listing indexes by status or type)."""
    p = "{" + engine.prefix + "}:"
    result = {"text": "x" * 200}
    jobs = [await enqueue(engine, "summarize", {"q": "y" * 200}, now=T0) for _ in range(20)]
    for job in jobs:
        claimed = await claim_one(engine, job.task_id, now=T0 + 1)
        await engine.finish(job.task_id, claimed.fence, Complete(result), now=T0 + 2)
    per_job = sorted([k.decode() async for k in client.scan_iter(match=f"*{jobs[-1].task_id}")])
    assert per_job == [p + "j:" + jobs[-1].task_id, p + "s:" + jobs[-1].task_id]
    # samples=0: every element counted (the default samples 5 and scales up, and which 5 it
    # takes moves a hash holding one 200-byte value by a kilobyte from run to run).
    own = sum([await client.memory_usage(k, samples=0) or 0 for k in per_job])
    shared = [
        k.decode()
        async for k in client.scan_iter(match=p + "*", count=1000)
        if not any(job.task_id.encode() in k for job in jobs)
    ]
    index_bytes = sum([await client.memory_usage(k, samples=0) or 0 for k in shared]) / len(jobs)
    assert own + index_bytes < 2816, (own, index_bytes)


async def _blocked(client: Redis) -> bool:
    """Whether some client of this Redis is blocked in XREAD (the backend's watcher)."""
    listing = await client.client_list()
    return any(c.get("cmd") in ("xread", "xreadgroup") for c in listing)


async def test_a_stream_an_earlier_release_wrote_expires_with_the_job(
    engine: RedisBackend, client: Redis
) -> None:
    """A process of an earlier release writes its events to the stream and leaves ``_es`` as it
    was ('0' on a job this release enqueued): the stream still gets the job's TTL at its end,
    and the events read back once each, in order."""
    job = await enqueue(engine, now=T0)
    claimed = await claim_one(engine, job.task_id, now=T0 + 1)
    j, e = keys(engine, job.task_id)
    # What an earlier release's append_event writes: the next seq, into the stream, no _es.
    seq = await client.hincrby(j, "_ev", 1)
    await client.xadd(e, {"t": "token", "d": '{"t":"a"}', "a": str(T0 + 1.5)}, id=f"{seq}-0")
    await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 2)
    assert await client.hget(j, "_es") == b"0"
    assert 60 <= await client.ttl(e) <= await client.ttl(j)
    assert [(ev.seq, ev.type) for ev in await engine.events(job.task_id)] == [
        (1, "status"),
        (2, "status"),
        (3, "token"),
        (4, "status"),
    ]
