"""What only the Redis backend promises: its key layout, expiry by EXPIRE, memory per job."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from backburner.backends import redis_reads
from backburner.backends.base import Complete, Fail, Quota, Release, RetryAt, Wait
from backburner.backends.redis import RedisBackend
from backburner.errors import BackendError, QuotaExceededError
from backburner.models import ErrorInfo, JobStatus, WebhookAttempt, WebhookStatus

from ..conformance._support import T0, claim_one, enqueue, error, new_job
from .test_redis_upgrade import dump

GRACE = 3600  # redis_lua/prelude.lua: keys outlive expires_at by this much


async def keys_of(client: Redis, prefix: str) -> list[str]:
    return sorted([k.decode() async for k in client.scan_iter(match=f"*{prefix}*", count=1000)])


async def test_every_key_is_under_the_prefix_and_its_hash_tag(
    engine: RedisBackend, client: Redis
) -> None:
    job = await enqueue(engine, "summarize", now=T0, idempotency_key="k1")
    claimed = await claim_one(engine, now=T0)
    await engine.append_event(job.task_id, claimed.fence, "tick", {"n": 1}, now=T0)
    await engine.heartbeat("w1", {job.task_id: claimed.fence}, now=T0, lease_s=30)
    await engine.finish(job.task_id, claimed.fence, Complete({"ok": True}), now=T0 + 1)
    keys = await keys_of(client, engine.prefix)
    assert keys, "nothing was stored"
    assert all(k.startswith("{" + engine.prefix + "}:") for k in keys), keys
    per_job = [k for k in keys if job.task_id in k]
    assert sorted(k.split(":")[1] for k in per_job) == ["e", "j", "s"]


async def test_terminal_jobs_expire_by_redis_ttl_and_a_replay_keeps_them(
    engine: RedisBackend, client: Redis
) -> None:
    job = await enqueue(engine, "summarize", now=T0, ttl_s=600, idempotency_key="k2")
    per_job = [f"{{{engine.prefix}}}:{kind}:{job.task_id}" for kind in "jse"]
    idem_key = f"{{{engine.prefix}}}:k:k2"
    assert await client.ttl(per_job[0]) == -1  # a live job never expires
    claimed = await claim_one(engine, now=T0)
    # (an event of its own makes its stream, e:<id>, which expires with it)
    await engine.append_event(job.task_id, claimed.fence, "tick", {}, now=T0)
    error = ErrorInfo(type="Boom", message="no")
    await engine.finish(job.task_id, claimed.fence, Fail(error, ttl_s=900), now=T0 + 1)
    for key in [*per_job, idem_key]:
        ttl = await client.ttl(key)
        assert 900 + GRACE - 5 <= ttl <= 900 + GRACE, (key, ttl)

    await engine.replay(job.task_id, now=T0 + 2, extra_attempts=1)
    for key in [*per_job, idem_key]:
        assert await client.ttl(key) == -1, key
    claimed = await claim_one(engine, now=T0 + 3)
    await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 4)
    assert 600 + GRACE - 5 <= await client.ttl(per_job[0]) <= 600 + GRACE

    # The sweeper's purge removes the job and every index entry, before the TTL would.
    assert await engine.purge_expired(now=T0 + 4 + 600, limit=10) == 1
    assert await keys_of(client, job.task_id) == []
    assert await client.exists(idem_key) == 0
    indexes = [k for k in await keys_of(client, engine.prefix) if ":i:" in k]
    for index in indexes:
        assert await client.zscore(index, job.task_id) is None, index


async def test_a_queued_job_costs_under_two_kilobytes(engine: RedisBackend, client: Redis) -> None:
    before = await keys_of(client, engine.prefix)
    jobs: list[Any] = [await enqueue(engine, "summarize", now=T0) for _ in range(20)]
    job_keys = [k for k in await keys_of(client, engine.prefix) if jobs[-1].task_id in k]
    # Queued jobs have no stream yet (a Redis 7 stream preallocates about 4 KB).
    assert sorted(k.split(":")[1] for k in job_keys) == ["j", "s"]
    assert await client.object("encoding", job_keys[0]) in (b"listpack", b"ziplist")
    own = sum([await client.memory_usage(k) or 0 for k in job_keys])
    indexes = [k for k in await keys_of(client, engine.prefix) if k not in before]
    shared = [k for k in indexes if not any(j.task_id in k for j in jobs)]
    index_bytes = sum([await client.memory_usage(k) or 0 for k in shared]) / len(jobs)
    assert own + index_bytes < 2048, (own, index_bytes)


async def test_tenants_are_three_global_hashes_an_index_and_a_tag_in_each_queue_member(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    first = await enqueue(engine, now=T0, tenant="acme")
    cheap = await enqueue(engine, now=T0, tenant="acme", fair_cost=250_000)
    later = await enqueue(engine, now=T0, tenant="acme", run_at=T0 + 5)
    job, _ = await engine.enqueue(new_job(now=T0, tenant="globex"), quota=Quota(per_minute=4))
    assert await client.hgetall(p + "inflight") == {b"acme": b"3", b"globex": b"1"}
    assert await client.hgetall(p + "rates") == {b"globex": b"%d" % (T0 + 15)}  # 60 s / 4
    # One hash per task type: its queue's clock at priority 0 (code 100), opened at the first
    # tag, and each tenant's last tag in that queue.
    assert await client.hgetall(p + "fair:summarize") == {
        b"100": b"0",
        b"100:acme": b"260000",
        b"100:globex": b"10000",
    }
    j = p + "j:" + cheap.task_id
    assert await client.hmget(j, "tenant", "_fc", "_tg") == [b'"acme"', b"250000", b"260000"]
    members = await client.zrange(p + "r:summarize", 0, -1)
    seqs = {first.task_id: 1, cheap.task_id: 2, job.task_id: 4}
    # <priority 3><tag 19><seq 12><run_at in µs 17><id>, in (priority, tag, seq) order
    assert members == [
        b"100%019d%012d%017d%s" % (tag, seqs[task_id], int(T0 * 1e6), task_id.encode())
        for tag, task_id in [
            (10_000, first.task_id),
            (10_000, job.task_id),
            (260_000, cheap.task_id),
        ]
    ]
    assert await client.zrange(p + "delayed", 0, -1, withscores=True) == [
        (b"%012d%s" % (3, later.task_id.encode()), T0 + 5)
    ]
    assert await client.zrange(p + "i:n:acme", 0, -1) == [
        t.task_id.encode() for t in (first, cheap, later)
    ]

    # A claim moves the clock to the largest tag it took; the delayed job, due now, joins.
    claimed = await engine.claim("w1", limit=2, now=T0 + 5, lease_s=30)
    assert [c.task_id for c in claimed] == [first.task_id, job.task_id]
    assert await client.hget(p + "fair:summarize", "100") == b"10000"
    assert await client.hget(p + "fair:summarize", "100:acme") == b"270000"
    assert await client.hget(p + "j:" + later.task_id, "_tg") == b"270000"
    await engine.finish(first.task_id, claimed[0].fence, Complete(None), now=T0 + 6)
    await engine.finish(job.task_id, claimed[1].fence, Complete(None), now=T0 + 6)
    assert await client.hgetall(p + "inflight") == {b"acme": b"2"}  # a tenant at 0 has no field
    assert await client.hexists(p + "j:" + first.task_id, "_tg") is False
    for queued in (cheap, later):
        await engine.cancel(queued.task_id, now=T0 + 7)
    assert await client.exists(p + "inflight") == 0
    assert await client.zcard(p + "r:summarize") == 0 and await client.zcard(p + "delayed") == 0
    assert await engine.purge_expired(now=T0 + 7 + 3600, limit=10) == 4
    assert await client.exists(p + "i:n:acme", p + "i:n:globex") == 0


async def test_each_type_has_its_own_clocks_and_tenants_last_tags(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    # Names with ':' in them: the key holds the type, a field the priority code (3 digits)
    # and then the tenant, so no two of them can meet.
    first = await enqueue(engine, "a:b", now=T0, tenant="x:100")
    await enqueue(engine, "a:b", now=T0, tenant="x:100")
    other = await enqueue(engine, "a", now=T0, tenant="x", priority=5)
    claimed = await engine.claim("w1", limit=1, now=T0, lease_s=30, types=["a:b"])
    assert [c.task_id for c in claimed] == [first.task_id]
    assert await client.hgetall(p + "fair:a:b") == {b"100": b"10000", b"100:x:100": b"20000"}
    assert await client.hgetall(p + "fair:a") == {b"095": b"0", b"095:x": b"10000"}
    # A new queue at priority 0 opens at the largest clock of any type there; one at a
    # priority nobody used yet at 0.
    await enqueue(engine, "c", now=T0, tenant="x")
    await enqueue(engine, "c", now=T0, tenant="x", priority=7)
    assert await client.hgetall(p + "fair:c") == {
        b"100": b"10000",
        b"100:x": b"20000",
        b"093": b"0",
        b"093:x": b"10000",
    }
    assert await client.exists(p + "fair") == 0
    (taken,) = await engine.claim("w1", limit=1, now=T0, lease_s=30, types=["a"])
    assert taken.task_id == other.task_id
    assert await client.hget(p + "fair:a", "095") == b"10000"
    assert await client.hget(p + "fair:a:b", "100") == b"10000"  # the other type's is as it was


async def test_replay_and_finish_take_a_job_without_tenant_or_cost_as_the_default_tenants(
    engine: RedisBackend, client: Redis
) -> None:
    """A hash without ``tenant`` and ``_fc`` (and ``_tg``, ``_pq``, ``priority``, ``_sq``)
    does not make a script fail half-way (once, a replay left such a job queued in no queue):
    each reads what it needs before its first write and takes the defaults, tenant "default"
    and the cost of weight 1, as the store upgrade would have given it."""
    p = "{" + engine.prefix + "}:"
    job = await enqueue(engine, "summarize", now=T0, tenant="acme")
    j = p + "j:" + job.task_id
    bare = ("tenant", "_fc", "_tg", "_pq", "priority", "_sq")
    claimed = await claim_one(engine, now=T0)
    await engine.finish(job.task_id, claimed.fence, Fail(error(), ttl_s=900), now=T0 + 1)
    await client.hdel(j, *bare)
    assert await client.exists(p + "inflight") == 0

    with pytest.raises(QuotaExceededError, match="'default'"):
        await engine.replay(job.task_id, now=T0 + 2, extra_attempts=3, quota=Quota(0))
    assert (await engine.get(job.task_id)).status == JobStatus.FAILED  # type: ignore[union-attr]
    replayed = await engine.replay(job.task_id, now=T0 + 2, extra_attempts=3, quota=Quota(1))
    assert replayed.status == JobStatus.QUEUED
    assert await client.hgetall(p + "inflight") == {b"default": b"1"}
    tag = b"%019d" % 20_000  # the queue's clock (10,000) + 10,000
    assert await client.zrange(p + "r:summarize", 0, -1) == [
        b"100" + tag + b"%012d%017d" % (1, int((T0 + 2) * 1e6)) + job.task_id.encode()
    ]

    # Claimed and handed back without a tag: first in line, at its queue's clock.
    claimed = await claim_one(engine, job.task_id, now=T0 + 3)
    await client.hdel(j, *bare)
    await engine.finish(job.task_id, claimed.fence, Release("shutdown"), now=T0 + 4)
    assert await client.zrange(p + "r:summarize", 0, -1) == [
        b"100%019d%012d%017d" % (20_000, 1, int((T0 + 4) * 1e6)) + job.task_id.encode()
    ]
    claimed = await claim_one(engine, job.task_id, now=T0 + 5)
    await client.hdel(j, *bare)
    retry = RetryAt(error(), run_at=T0 + 5)  # due now: to the back of the default tenant's line
    await engine.finish(job.task_id, claimed.fence, retry, now=T0 + 5)
    assert await client.hget(p + "fair:summarize", "100:default") == b"30000"
    assert await client.hget(j, "_tg") == b"30000"
    claimed = await claim_one(engine, job.task_id, now=T0 + 6)
    await client.hdel(j, *bare, "_ttl")
    done = await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 7)
    assert done.status == JobStatus.COMPLETED and done.expires_at == T0 + 7 + 3600  # spec's ttl
    assert await client.exists(p + "inflight") == 0
    assert await client.zcard(p + "r:summarize") == 0

    # So does a cancel, of a queued job (out of its queue) and of a running one.
    queued = await enqueue(engine, "summarize", now=T0 + 8)
    running = await enqueue(engine, "summarize", now=T0 + 8)
    claimed = await claim_one(engine, queued.task_id, now=T0 + 8)
    await engine.finish(queued.task_id, claimed.fence, Release("shutdown"), now=T0 + 8)
    claimed = await claim_one(engine, queued.task_id, now=T0 + 8)  # queued again, then running
    assert claimed.task_id == queued.task_id
    await engine.finish(queued.task_id, claimed.fence, Release("shutdown"), now=T0 + 8)
    for task_id in (queued.task_id, running.task_id):
        await client.hdel(p + "j:" + task_id, *bare, "_ttl")
    await engine.cancel(queued.task_id, now=T0 + 9)
    assert [m[51:] for m in await client.zrange(p + "r:summarize", 0, -1)] == [
        running.task_id.encode()
    ]
    claimed = await claim_one(engine, running.task_id, now=T0 + 9)
    await client.hdel(p + "j:" + running.task_id, *bare)
    cancelled, changed = await engine.cancel(running.task_id, now=T0 + 10)
    assert changed and cancelled.expires_at == T0 + 10 + 3600
    assert await engine.poll_cancellations("w1") == {running.task_id: claimed.fence}
    assert await client.exists(p + "inflight") == 0
    assert await client.zcard(p + "r:summarize") == 0
    assert await client.zcard(p + "i:st:queued:summarize") == 0
    assert await client.zcard(p + "i:st:processing:summarize") == 0


async def test_a_job_without_a_type_is_refused_before_anything_is_written(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    job = await enqueue(engine, "summarize", now=T0)
    claimed = await claim_one(engine, now=T0)
    await client.hdel(p + "j:" + job.task_id, "_ty")
    before = await dump(client, engine.prefix)
    for outcome in (Complete(None), Release("shutdown"), RetryAt(error(), run_at=T0)):
        with pytest.raises(BackendError, match="has no task type"):
            await engine.finish(job.task_id, claimed.fence, outcome, now=T0 + 1)
        assert await dump(client, engine.prefix) == before
    await client.hset(p + "j:" + job.task_id, "_ty", "summarize")
    await engine.finish(job.task_id, claimed.fence, Fail(error(), ttl_s=900), now=T0 + 1)
    await client.hdel(p + "j:" + job.task_id, "_ty")
    before = await dump(client, engine.prefix)
    with pytest.raises(BackendError, match="has no task type"):
        await engine.replay(job.task_id, now=T0 + 2, extra_attempts=1)
    assert await dump(client, engine.prefix) == before


async def test_a_listing_page_cut_short_by_its_scan_budget_goes_on_from_its_cursor(
    engine: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_reads, "_LIST_SCAN_BUDGET", 5)
    wanted = []
    for i in range(12):  # acme's index is the smaller one: the walk is through it
        job = await enqueue(engine, payload={"i": i}, now=T0, tenant="acme")
        if i % 3 == 0:
            await engine.cancel(job.task_id, now=T0)
            wanted.append(job.task_id)
        for _ in range(2):
            other = await enqueue(engine, payload={"i": i}, now=T0, tenant="globex")
            await engine.cancel(other.task_id, now=T0)
    seen, cursor, pages = [], None, 0
    while True:
        page = await engine.list_jobs(
            tenant="acme", status=JobStatus.CANCELLED, limit=2, cursor=cursor
        )
        pages += 1
        assert len(page.jobs) <= 2
        seen += [j.task_id for j in page.jobs]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == wanted[::-1]
    assert pages > 2  # some pages were cut short (acme's 12 are looked at, 5 at a time)


async def test_children_are_a_hash_field_an_index_per_parent_and_a_global_open_count(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    parent = await enqueue(engine, now=T0)
    claimed = await claim_one(engine, parent.task_id, now=T0)
    kids = [await enqueue(engine, now=T0, parent_id=parent.task_id) for _ in range(3)]
    assert await client.hget(p + "j:" + kids[0].task_id, "parent_id") == (
        b'"%s"' % parent.task_id.encode()
    )
    assert await client.hexists(p + "j:" + parent.task_id, "parent_id") is False
    assert await client.zrange(p + "i:p:" + parent.task_id, 0, -1, withscores=True) == [
        (k.task_id.encode(), float(n)) for n, k in enumerate(kids, start=2)
    ]
    assert await client.hgetall(p + "open") == {parent.task_id.encode(): b"3"}

    # Wait parks the parent in the delayed set (no tag until it is due), its count unchanged.
    waiting = await engine.finish(
        parent.task_id, claimed.fence, Wait(T0 + 3600, "children"), now=T0 + 1
    )
    assert waiting.status == JobStatus.QUEUED and waiting.attempts == 0
    assert await client.zrange(p + "delayed", 0, -1, withscores=True) == [
        (b"%012d%s" % (1, parent.task_id.encode()), T0 + 3600)
    ]
    assert await client.hget(p + "inflight", "default") == b"1"  # children are not counted

    # Children end: complete, fail (then replayed: open again), cancel; 0 drops the field.
    first, second = await engine.claim("w1", limit=2, now=T0 + 2, lease_s=30)
    await engine.finish(first.task_id, first.fence, Complete(1), now=T0 + 3)
    await engine.finish(second.task_id, second.fence, Fail(error(), ttl_s=60), now=T0 + 3)
    assert await client.hget(p + "open", parent.task_id) == b"1"
    await engine.replay(second.task_id, now=T0 + 4, extra_attempts=1)
    assert await client.hget(p + "open", parent.task_id) == b"2"
    for kid in (kids[1], kids[2]):
        await engine.cancel(kid.task_id, now=T0 + 5)
    assert await client.exists(p + "open") == 0
    assert await engine.has_open_children(parent.task_id) is False

    # wake: out of the delayed set into its ready queue with a tag, due now.
    assert await engine.wake(parent.task_id, now=T0 + 6) is True
    assert await client.zcard(p + "delayed") == 0
    tag = int(await client.hget(p + "j:" + parent.task_id, "_tg") or 0)
    assert await client.zrange(p + "r:summarize", 0, -1) == [
        b"100%019d%012d%017d%s" % (tag, 1, int((T0 + 6) * 1e6), parent.task_id.encode())
    ]
    assert await engine.wake(parent.task_id, now=T0 + 6) is False

    # Children are kept while their parent is stored (until its expiry); then the purge takes
    # them out of their parent's index, and the last one takes the key.
    assert await engine.purge_expired(now=T0 + 10_000, limit=10) == 0
    assert await client.zcard(p + "i:p:" + parent.task_id) == 3
    await engine.cancel(parent.task_id, now=T0 + 10_000)  # expires an hour later (its ttl)
    assert await engine.purge_expired(now=T0 + 20_000, limit=10) == 4
    assert await client.exists(p + "i:p:" + parent.task_id) == 0


async def test_a_listing_of_a_parents_children_by_status_walks_the_parents_index(
    engine: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_reads, "_LIST_SCAN_BUDGET", 5)
    parent = await enqueue(engine, now=T0, run_at=T0 + 100)
    wanted = []
    for i in range(6):
        kid = await enqueue(engine, payload={"i": i}, now=T0, parent_id=parent.task_id)
        if i % 2 == 0:
            await engine.cancel(kid.task_id, now=T0)
            wanted.append(kid.task_id)
        for _ in range(3):  # many more cancelled jobs that are nobody's children
            other = await enqueue(engine, payload={"i": i}, now=T0)
            await engine.cancel(other.task_id, now=T0)

    async def walk(**filters: Any) -> tuple[list[str], int]:
        seen, cursor, pages = [], None, 0
        while True:
            page = await engine.list_jobs(
                parent_id=parent.task_id,
                status=JobStatus.CANCELLED,
                limit=2,
                cursor=cursor,
                **filters,
            )
            pages += 1
            seen += [j.task_id for j in page.jobs]
            cursor = page.next_cursor
            if cursor is None:
                return seen, pages

    # The parent's 6 are looked at, 5 at a time; not the 21 cancelled jobs.
    assert await walk() == (wanted[::-1], 2)
    assert await walk(tenant="default", type="summarize") == (wanted[::-1], 2)


async def test_a_slot_key_is_a_sorted_set_that_expires_after_its_last_lease(
    engine: RedisBackend, client: Redis
) -> None:
    slot_grace_ms = 60_000  # redis_lua/prelude.lua: SLOT_GRACE_MS
    key = f"{{{engine.prefix}}}:slot:model-x"
    assert await engine.acquire_slot("model-x", "a", limit=2, lease_s=30, now=T0) is True
    assert await engine.acquire_slot("model-x", "b", limit=2, lease_s=90, now=T0) is True
    assert await keys_of(client, engine.prefix) == sorted([key, f"{{{engine.prefix}}}:layout"])
    assert await client.type(key) == b"zset"
    assert await client.zrange(key, 0, -1, withscores=True) == [(b"a", T0 + 30), (b"b", T0 + 90)]
    # The TTL follows the latest lease, whoever set it last.
    assert await engine.renew_slot("model-x", "a", lease_s=10, now=T0 + 1) is True
    assert 90_000 + slot_grace_ms - 5000 <= await client.pttl(key) <= 90_000 + slot_grace_ms
    await engine.release_slot("model-x", "a")
    await engine.release_slot("model-x", "b")
    assert await client.exists(key) == 0


async def test_a_webhook_message_is_a_hash_in_the_due_set_that_goes_with_its_job(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    job = await enqueue(engine, "summarize", now=T0, ttl_s=600, webhook_url="https://h.example/in")
    assert await client.hget(p + "j:" + job.task_id, "webhook_url") == b'"https://h.example/in"'
    claimed = await claim_one(engine, now=T0)
    # (an event of its own makes its stream, e:<id>, which expires with it)
    await engine.append_event(job.task_id, claimed.fence, "tick", {}, now=T0)
    error = ErrorInfo(type="Boom", message="no")
    await engine.finish(job.task_id, claimed.fence, Fail(error, ttl_s=900), now=T0 + 1)
    (message,) = await engine.webhook_deliveries(job.task_id)
    msg_key, list_key, due = p + "wh:" + message.msg_id, p + "wh:job:" + job.task_id, p + "wh:due"
    assert await client.type(msg_key) == b"hash"
    assert await client.hget(msg_key, "status") == b'"pending"'
    assert await client.hget(msg_key, "attempts") == b"[]"
    assert await client.lrange(list_key, 0, -1) == [message.msg_id.encode()]
    assert await client.zscore(due, message.msg_id) == T0 + 1
    for key in (msg_key, list_key):  # the job's expiry, grace included
        assert 900 + GRACE - 5 <= await client.ttl(key) <= 900 + GRACE, key
    assert await client.ttl(due) == -1

    # A replay keeps the message, and keeps it as long as the job; the next end expires both.
    await engine.replay(job.task_id, now=T0 + 2, extra_attempts=1)
    assert await client.ttl(msg_key) == -1 and await client.ttl(list_key) == -1
    claimed = await claim_one(engine, now=T0 + 3)
    await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 4)
    first, second = await engine.webhook_deliveries(job.task_id)
    assert (first.msg_id, first.event, second.event) == (
        message.msg_id,
        "task.failed",
        "task.completed",
    )
    for key in (msg_key, p + "wh:" + second.msg_id, list_key):
        assert 600 + GRACE - 5 <= await client.ttl(key) <= 600 + GRACE, key

    # The purge takes the messages, their list and their due entries with the job.
    assert await engine.purge_expired(now=T0 + 4 + 600, limit=10) == 1
    assert [k for k in await keys_of(client, engine.prefix) if ":wh:" in k] == []


async def test_progress_messages_wait_without_a_ttl_and_take_the_job_s_at_its_end(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    plain = await enqueue(engine, "other", now=T0 + 1, webhook_url="https://h.example/in")
    assert await client.hexists(p + "j:" + plain.task_id, "webhook_progress") is False
    job = await enqueue(
        engine,
        "summarize",
        now=T0,
        ttl_s=600,
        webhook_url="https://h.example/in",
        webhook_progress=True,
    )
    j = p + "j:" + job.task_id
    assert await client.hget(j, "webhook_progress") == b"true"
    claimed = await claim_one(engine, job.task_id, now=T0)
    assert await engine.add_progress_webhook(job.task_id, claimed.fence, now=T0 + 1) is True
    (message,) = await engine.webhook_deliveries(job.task_id)
    msg_key, list_key = p + "wh:" + message.msg_id, p + "wh:job:" + job.task_id
    assert await client.hget(j, "_whp") == message.msg_id.encode()  # the one that may wait
    assert await client.hget(msg_key, "event") == b'"task.progress"'
    assert await client.zscore(p + "wh:due", message.msg_id) == T0 + 1
    assert await client.ttl(msg_key) == -1 and await client.ttl(list_key) == -1
    await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 2)
    progress, final = await engine.webhook_deliveries(job.task_id)
    assert progress.msg_id == message.msg_id and final.event == "task.completed"
    for key in (msg_key, p + "wh:" + final.msg_id, list_key):
        assert 600 + GRACE - 5 <= await client.ttl(key) <= 600 + GRACE, key


async def test_settled_messages_sit_in_a_sorted_set_by_status_and_go_with_their_job(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    delivered, failed = p + "wh:delivered", p + "wh:failed"
    ids = []
    for _ in range(4):
        job = await enqueue(engine, "summarize", now=T0, ttl_s=600, webhook_url="https://h.ex/")
        claimed = await claim_one(engine, job.task_id, now=T0)
        await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 1)
        ids.append(job.task_id)
    messages = await engine.claim_webhooks(now=T0 + 1, limit=4, lease_s=30)
    assert len(messages) == 4
    ok = WebhookAttempt(at=T0 + 5, status_code=204)
    first = messages[0]
    await engine.record_webhook_attempt(
        first.msg_id, first.claim, ok, status=WebhookStatus.DELIVERED, next_at=None, body="{}"
    )
    gone = WebhookAttempt(at=T0 + 9, status_code=410)  # three failures at the same instant
    for message in messages[1:]:
        await engine.record_webhook_attempt(
            message.msg_id,
            message.claim,
            gone,
            status=WebhookStatus.FAILED,
            next_at=None,
            body="{}",
        )
    assert await client.zrange(delivered, 0, -1, withscores=True) == [
        (messages[0].msg_id.encode(), T0 + 5)
    ]
    assert await client.zcard(failed) == 3 and await client.zscore(failed, messages[1].msg_id) == (
        T0 + 9
    )
    assert await engine.webhook_counts() == {"pending": 0, "delivered": 1, "failed": 3}

    # Ties page by msg_id, descending, one at a time; a message gone meanwhile is skipped.
    expected = sorted((m.msg_id for m in messages[1:]), reverse=True)
    seen, cursor = [], None
    while True:
        page, cursor = await engine.failed_webhooks(limit=1, cursor=cursor)
        seen += [m.msg_id for m in page]
        if cursor is None:
            break
    assert seen == expected
    await client.delete(p + "wh:" + expected[1])
    page, cursor = await engine.failed_webhooks(limit=1, cursor=None)
    assert [m.msg_id for m in page] == [expected[0]] and cursor is not None
    page, cursor = await engine.failed_webhooks(limit=1, cursor=cursor)
    assert [m.msg_id for m in page] == [expected[2]] and cursor is None

    # A redelivery makes a message pending again: out of the settled sets.
    task_of = {m.msg_id: m.task_id for m in messages}
    await engine.redeliver_webhook(task_of[messages[0].msg_id], now=T0 + 20)
    await engine.redeliver_webhook(task_of[expected[0]], now=T0 + 20)
    assert await client.zcard(delivered) == 0
    assert await client.zscore(failed, expected[0]) is None
    assert await engine.webhook_counts() == {"pending": 2, "delivered": 0, "failed": 2}

    # The purge takes them out of every set with their jobs.
    assert await engine.purge_expired(now=T0 + 1 + 600, limit=10) == 4
    assert [k for k in await keys_of(client, engine.prefix) if ":wh:" in k] == []


async def test_a_message_counts_its_claims_and_tries_and_one_from_before_reads_them_as_0(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    job = await enqueue(engine, "summarize", now=T0, webhook_url="https://h.example/in")
    claimed = await claim_one(engine, now=T0)
    await engine.finish(job.task_id, claimed.fence, Complete(None), now=T0 + 1)
    (message,) = await engine.webhook_deliveries(job.task_id)
    m = p + "wh:" + message.msg_id
    assert (await client.hget(m, "claim"), await client.hget(m, "tries")) == (b"0", b"0")

    # A message written before claim numbers existed has neither field: it reads as 0, and
    # its first claim hands out 1.
    await client.hdel(m, "claim", "tries")
    (old,) = await engine.webhook_deliveries(job.task_id)
    assert (old.claim, old.tries) == (0, 0)
    (leased,) = await engine.claim_webhooks(now=T0 + 1, limit=1, lease_s=30)
    assert leased.claim == 1 and await client.hget(m, "claim") == b"1"
    busy = WebhookAttempt(at=T0 + 2, status_code=503)
    assert not await engine.record_webhook_attempt(  # a claim number never handed out
        message.msg_id, 0, busy, status=WebhookStatus.PENDING, next_at=T0 + 60, body="{}"
    )
    assert await client.hget(m, "attempts") == b"[]"
    assert await engine.record_webhook_attempt(
        message.msg_id, 1, busy, status=WebhookStatus.PENDING, next_at=T0 + 60, body="{}"
    )
    assert await client.hget(m, "tries") == b"1"
    assert await client.zscore(p + "wh:due", message.msg_id) == T0 + 60

    # A redelivery takes the next claim number and starts the tries again, log kept.
    again = await engine.redeliver_webhook(job.task_id, now=T0 + 3)
    assert (again.claim, again.tries, len(again.attempts)) == (2, 0, 1)
    assert (await client.hget(m, "claim"), await client.hget(m, "tries")) == (b"2", b"0")


async def _as_the_previous_release_stored_it(client: Redis, p: str, task_id: str, url: str) -> None:
    """The job's webhook_url only in its spec (a member after ttl_s: ``git show
    1cc9bfe:backburner/backends/redis_codec.py``), not in its hash."""
    spec = await client.get(p + "s:" + task_id)
    assert isinstance(spec, bytes)
    assert b'"webhook_url"' not in spec, spec  # the spec no longer stores it: write it there
    assert spec.rsplit(b",", 1)[1].startswith(b'"ttl_s":'), spec  # no timeout_s, no key
    await client.set(p + "s:" + task_id, spec + b',"webhook_url":' + json.dumps(url).encode())
    assert await client.hdel(p + "j:" + task_id, "webhook_url") == 1


async def test_a_job_of_the_previous_release_keeps_its_webhook_from_its_spec(
    engine: RedisBackend, client: Redis
) -> None:
    p = "{" + engine.prefix + "}:"
    url = "https://h.example/in/old?x=1"
    done = await enqueue(engine, "summarize", now=T0, webhook_url=url)
    cancelled = await enqueue(engine, "summarize", now=T0 + 1, webhook_url=url)
    for job in (done, cancelled):
        await _as_the_previous_release_stored_it(client, p, job.task_id, url)
        assert (await engine.get(job.task_id)).webhook_url == url  # type: ignore[union-attr]

    claimed = await claim_one(engine, done.task_id, now=T0 + 2)
    await engine.finish(done.task_id, claimed.fence, Complete({"ok": 1}), now=T0 + 3)
    (message,) = await engine.webhook_deliveries(done.task_id)
    assert (message.event, message.url, message.status) == (
        "task.completed",
        url,
        WebhookStatus.PENDING,
    )
    # Stored as a new job's url is, byte for byte (cjson would have escaped each "/").
    stored = await client.hget(p + "wh:" + message.msg_id, "url")
    assert stored == json.dumps(url).encode()
    assert await client.zscore(p + "wh:due", message.msg_id) == T0 + 3

    await engine.cancel(cancelled.task_id, now=T0 + 4)
    (message,) = await engine.webhook_deliveries(cancelled.task_id)
    assert (message.event, message.url) == ("task.cancelled", url)

    # A worker's finish passes the job as claimed, whose url the claim read from the spec: the
    # script, told there is a webhook, looks for it there too.
    worked = await enqueue(engine, "summarize", now=T0 + 4, webhook_url=url)
    await _as_the_previous_release_stored_it(client, p, worked.task_id, url)
    claimed = await claim_one(engine, worked.task_id, now=T0 + 4)
    assert claimed.webhook_url == url
    await engine.finish(worked.task_id, claimed.fence, Complete(1), now=T0 + 5, claimed=claimed)
    (message,) = await engine.webhook_deliveries(worked.task_id)
    assert (message.event, message.url) == ("task.completed", url)

    # Without a webhook_url anywhere, nothing is written, even when the input names one.
    plain = await enqueue(engine, "other", {"webhook_url": url}, now=T0 + 5)
    claimed = await claim_one(engine, plain.task_id, now=T0 + 5)
    await engine.finish(plain.task_id, claimed.fence, Complete(None), now=T0 + 6)
    assert await engine.webhook_deliveries(plain.task_id) == []
