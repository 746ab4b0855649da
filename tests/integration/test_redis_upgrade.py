"""A Redis store written by the release before tenants (key layout 1, commit 024d13c) is
upgraded in place by ``RedisBackend.connect``: no job is lost, doubled or reordered, a running
job keeps its lease, and the tenant bookkeeping (in-flight count, listing index) is right.

The old store is written with redis-py, command for command as 024d13c's scripts wrote it
(``OldRelease`` below mirrors its redis_lua/enqueue.lua, claim.lua, heartbeat.lua and
finish.lua's 'complete' and 'fail', with the hash fields and spec of its
redis_codec.new_job_fields / new_job_spec), rather than by running that release's code.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import ConnectionPool, Redis

from backburner.backends import redis as redis_backend
from backburner.backends.base import Complete, Release, new_task_id
from backburner.backends.redis import RedisBackend
from backburner.backends.redis_link import RedisLink
from backburner.backends.redis_upgrade import LAYOUT_VERSION, upgrade_layout
from backburner.errors import ConfigurationError
from backburner.models import JobStatus

from ..conformance._support import new_job
from ..conftest import REDIS_TEST_URL, drop_redis_keys, require_redis

T0 = 1000.0
LEASE = 60.0
LAYOUT = str(LAYOUT_VERSION).encode()
GRACE = 3600  # 024d13c redis_lua/prelude.lua


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    require_redis()
    name = "test-upgrade-" + uuid.uuid4().hex[:12]
    yield name
    await drop_redis_keys(RedisBackend(REDIS_TEST_URL, prefix=name))


# -- the release before tenants, as its scripts wrote the store -------------------------------


def _num(value: float) -> str:
    """024d13c redis_codec.number: what Python passed for a float."""
    return repr(float(value))


def _lua_num(value: float) -> str:
    """024d13c prelude.lua num(): what Lua wrote for a float it computed."""
    return format(value, ".17g")


def _run_code(run_at: float) -> str:
    """024d13c redis_codec.run_code."""
    return f"{max(0, int(run_at * 1_000_000)):017d}"


class OldRelease:
    """Writes a store the way 024d13c did (key layout 1)."""

    def __init__(self, client: Redis, prefix: str) -> None:
        self.r = client
        self.p = "{" + prefix + "}:"

    def j(self, task_id: str) -> str:
        return self.p + "j:" + task_id

    async def _reindex(self, task_id: str, ty: str, seq: int, old: str | None, new: str) -> None:
        p = self.p
        if old is not None:
            await self.r.zrem(p + "i:s:" + old, task_id)
            await self.r.zrem(p + "i:st:" + old + ":" + ty, task_id)
        await self.r.zadd(p + "i:s:" + new, {task_id: seq})
        await self.r.zadd(p + "i:st:" + new + ":" + ty, {task_id: seq})

    async def _event(self, task_id: str, kind: str, data: str, at: str) -> None:
        seq = await self.r.hincrby(self.j(task_id), "_ev", 1)
        await self.r.xadd(self.p + "e:" + task_id, {"t": kind, "d": data, "a": at}, id=f"{seq}-0")

    async def enqueue(
        self,
        *,
        task_type: str = "summarize",
        priority: int = 0,
        now: float = T0,
        run_at: float | None = None,
        ttl_s: float = 3600.0,
    ) -> str:
        """enqueue.lua: a new queued job, ready (delayed if run_at > now)."""
        p, task_id = self.p, new_task_id()
        due = now if run_at is None else run_at
        seq = await self.r.incr(p + "seq")
        sq = f"{seq:012d}"
        pq = f"{100 - priority:03d}"
        spec = ",".join(
            [
                f'"task_id":{json.dumps(task_id)}',
                f'"type":{json.dumps(task_type)}',
                f'"input":{{"n":{seq}}}',
                f'"created_at":{_num(now)}',
                '"metadata":{}',
                f'"ttl_s":{_num(ttl_s)}',
            ]
        )
        await self.r.hset(
            self.j(task_id),
            mapping={
                "_sq": sq,
                "_fp": uuid.uuid4().hex,
                "_ev": 1,
                "_ca": _num(now),
                "status": '"queued"',
                "priority": str(priority),
                "run_at": _num(due),
                "attempts": "0",
                "max_attempts": "3",
                "fence": "0",
                "_ty": task_type,
                "_pq": pq,
                "_ttl": _num(ttl_s),
                "_pp": "0",
            },
        )
        await self.r.set(p + "s:" + task_id, spec)
        await self.r.zadd(p + "i:all", {task_id: seq})
        await self.r.zadd(p + "i:t:" + task_type, {task_id: seq})
        await self._reindex(task_id, task_type, seq, None, "queued")
        await self.r.sadd(p + "types", task_type)
        await self.r.hincrby(p + "qprio", str(priority), 1)
        code = pq + _run_code(due) + sq  # enqueue_ready
        await self.r.hset(self.j(task_id), "_qm", code)
        if due > now:
            await self.r.zadd(p + "delayed", {task_id: due})
        else:
            await self.r.zadd(p + "r:" + task_type, {code + task_id: 0})
        return task_id

    async def claim(self, task_id: str, worker: str, *, now: float) -> None:
        """claim.lua, for one ready job: processing under a lease, attempt 1, fence 1."""
        j = self.j(task_id)
        code, ty, attempts, fence, sq, priority = await self.r.hmget(
            j, "_qm", "_ty", "attempts", "fence", "_sq", "priority"
        )
        assert await self.r.zrem(self.p + "r:" + ty.decode(), code + task_id.encode()) == 1
        attempt, wjson, lease = int(attempts) + 1, json.dumps(worker), _num(now + LEASE)
        cur = f'{{"attempt":{attempt},"worker_id":{wjson},"started_at":{_num(now)}'
        await self.r.hset(
            j,
            mapping={
                "status": '"processing"',
                "attempts": attempt,
                "fence": int(fence) + 1,
                "worker_id": wjson,
                "lease_expires_at": lease,
                "started_at": _num(now),
                "_cur": cur,
            },
        )
        await self.r.hdel(j, "_qm")
        await self.r.zadd(self.p + "leases", {task_id: now + LEASE})
        await self._reindex(task_id, ty.decode(), int(sq), "queued", "processing")
        await self.r.hincrby(self.p + "qprio", priority.decode(), -1)
        data = f'{{"status":"processing","attempt":{attempt},"worker_id":{wjson}}}'
        await self._event(task_id, "status", data, _num(now))

    async def heartbeat(self, worker: str, task_id: str, *, now: float) -> None:
        """heartbeat.lua, for one job held with fence 1."""
        lease = _num(now + LEASE)
        await self.r.hset(self.j(task_id), "lease_expires_at", lease)
        await self.r.zadd(self.p + "leases", {task_id: now + LEASE})
        await self.r.hset(self.p + "workers", worker, f"{_num(now)} {_num(now)} 1")

    async def _finish(self, task_id: str, status: str, error: str | None, *, now: float) -> None:
        """finish.lua 'complete' or 'fail' of a job held with fence 1 (no webhook, ttl 1 h)."""
        j, at = self.j(task_id), _num(now)
        ty, sq, cur = await self.r.hmget(j, "_ty", "_sq", "_cur")
        await self.r.zrem(self.p + "leases", task_id)
        record = cur.decode() + f',"finished_at":{at},"outcome":"{status}"'
        if error is not None:
            record += f',"error":{error}'
        await self.r.hset(j, "_hist", record + "}")  # close_history
        await self.r.hdel(j, "_cur")
        expires = now + 3600.0
        fields = {"status": f'"{status}"', "finished_at": at, "expires_at": _lua_num(expires)}
        if error is None:
            await self.r.hset(j, mapping=fields | {"result": '{"ok":true}', "_pp": "100"})
            await self.r.hdel(j, "error", "lease_expires_at")
        else:
            await self.r.hset(j, mapping=fields | {"error": error})
            await self.r.hdel(j, "lease_expires_at")
        await self._reindex(task_id, ty.decode(), int(sq), "processing", status)
        if error is None:
            await self._event(task_id, "status", '{"status":"completed","result":{"ok":true}}', at)
        else:
            await self._event(task_id, "attempt_failed", f'{{"error":{error},"attempt":1}}', at)
            await self._event(task_id, "status", f'{{"status":"failed","error":{error}}}', at)
        await self.r.zadd(self.p + "expiring", {task_id: expires})  # make_terminal
        key_ttl = max(1, math.ceil(expires - now)) + GRACE
        for kind in "jse":
            await self.r.expire(self.p + kind + ":" + task_id, key_ttl)

    async def complete(self, task_id: str, *, now: float) -> None:
        await self._finish(task_id, "completed", None, now=now)

    async def fail(self, task_id: str, *, now: float) -> None:
        """To the dead-letter queue (not retryable)."""
        error = '{"type":"boom","message":"it broke","retryable":false}'
        await self._finish(task_id, "failed", error, now=now)


# -- checks --------------------------------------------------------------------------------


async def dump(client: Redis, prefix: str) -> dict[str, Any]:
    """Every key of the store and what it holds."""
    out: dict[str, Any] = {}
    async for raw in client.scan_iter(match="{" + prefix + "}:*", count=1000):
        key = raw.decode()
        kind = (await client.type(raw)).decode()
        if kind == "hash":
            out[key] = await client.hgetall(raw)
        elif kind == "zset":
            out[key] = await client.zrange(raw, 0, -1, withscores=True)
        elif kind == "string":
            out[key] = await client.get(raw)
        elif kind == "set":
            out[key] = sorted(await client.smembers(raw))
        elif kind == "stream":
            out[key] = await client.xrange(raw)
        else:
            out[key] = await client.lrange(raw, 0, -1)
    return out


async def assert_each_job_in_one_layout(client: Redis, prefix: str, ids: set[str]) -> None:
    """Every queued job is in exactly one queue, with a member of its own layout (its hash has
    a tenant: this layout; none: the old one); no other job is in any; the in-flight count and
    the tenant's listing index hold exactly the jobs converted so far."""
    p = "{" + prefix + "}:"
    entries: Counter[tuple[str, str]] = Counter()
    async for key in client.scan_iter(match=p + "r:*"):
        for raw in await client.zrange(key, 0, -1):
            member = raw.decode()
            if member[32:] in ids:
                entries[(member[32:], "old")] += 1
            else:
                assert member[51:] in ids, member
                entries[(member[51:], "new")] += 1
    for raw in await client.zrange(p + "delayed", 0, -1):
        member = raw.decode()
        if member in ids:
            entries[(member, "old")] += 1
        else:
            assert member[12:] in ids, member
            entries[(member[12:], "new")] += 1
    converted, in_flight = set(), 0
    for task_id in ids:
        status, tenant, qm = await client.hmget(p + "j:" + task_id, "status", "tenant", "_qm")
        layout = "new" if tenant else "old"
        if tenant:
            assert tenant == b'"default"' and qm is None
            converted.add(task_id)
            in_flight += status in (b'"queued"', b'"processing"')
        mine = {k: n for k, n in entries.items() if k[0] == task_id}
        if status == b'"queued"':
            assert mine == {(task_id, layout): 1}, (task_id, layout, mine)
        else:
            assert mine == {}, (task_id, mine)
    assert int(await client.hget(p + "inflight", "default") or 0) == in_flight
    assert {m.decode() for m in await client.zrange(p + "i:n:default", 0, -1)} == converted


async def claim_all(engine: RedisBackend, *, now: float) -> list[str]:
    """Ids of every job due at ``now``, claimed one at a time (so in claim order)."""
    order: list[str] = []
    while jobs := await engine.claim("w2", limit=1, now=now, lease_s=LEASE):
        assert jobs[0].status == JobStatus.PROCESSING and jobs[0].attempts == 1
        order.append(jobs[0].task_id)
    return order


async def old_store(old: OldRelease, ready: int, delayed: int) -> tuple[list[str], list[str]]:
    """``ready`` due jobs at two priorities and of two types, whose run_at does not follow
    their enqueue order (some were enqueued by an API whose clock ran behind), and ``delayed``
    ones: the ready ones in the order a claim of every type takes them once upgraded, and the
    delayed ones.

    Each ready queue (a type and priority) keeps its old claim order (run_at, then seq): its
    jobs get tags 10,000, 20,000, ... in that order, as if this release had enqueued them in
    it. Across queues a claim merges by (priority, tag, seq), as for any jobs of this release,
    so two types take turns rather than following the old order across types (run_at)."""
    made: list[tuple[int, float, int, str, str]] = []
    for n in range(ready):
        priority = 5 if n % 3 == 0 else 0
        now = T0 + (n * 7) % 11  # equal run_ats too: then seq decides
        task_type = "translate" if n % 2 else "summarize"
        task_id = await old.enqueue(task_type=task_type, priority=priority, now=now)
        made.append((-priority, now, n, task_type, task_id))
    later = [await old.enqueue(now=T0, run_at=T0 + 100 + n) for n in range(delayed)]
    rank: Counter[tuple[str, int]] = Counter()
    merged = []
    for minus_priority, _, n, task_type, task_id in sorted(made):  # the old claim order
        rank[task_type, minus_priority] += 1
        merged.append((minus_priority, rank[task_type, minus_priority], n, task_id))
    return [task_id for *_, task_id in sorted(merged)], later


async def test_a_store_of_the_release_before_tenants_is_upgraded_and_its_jobs_carry_on(
    client: Redis, prefix: str
) -> None:
    old = OldRelease(client, prefix)
    running, done, dead = [await old.enqueue(now=T0 - 60) for _ in range(3)]
    for task_id in (running, done, dead):
        await old.claim(task_id, "w1", now=T0 - 50)
    await old.heartbeat("w1", running, now=T0 - 20)
    await old.complete(done, now=T0 - 45)
    await old.fail(dead, now=T0 - 45)
    # Queued: "late" is enqueued first but due last (an API whose clock ran ahead), so the
    # old order is (priority, run_at, seq), not enqueue order; "tie" is due with "other".
    late = await old.enqueue(now=T0 + 3)
    first = await old.enqueue(now=T0)
    urgent = await old.enqueue(priority=5, now=T0 + 1)
    other = await old.enqueue(task_type="translate", now=T0 + 1)
    tie = await old.enqueue(now=T0 + 1)
    second = await old.enqueue(now=T0 + 2)
    soon = await old.enqueue(now=T0, run_at=T0 + 100)
    later = await old.enqueue(now=T0, run_at=T0 + 200)
    every = {running, done, dead, late, first, urgent, other, tie, second, soon, later}
    p = "{" + prefix + "}:"

    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        assert await client.get(p + "layout") == LAYOUT
        assert not await client.exists(p + "upgrade", p + "upgrade:ready")
        # Layout 1's listing indexes by status alone and by type alone are gone; listings by
        # either merge the indexes by both.
        assert not await client.exists(*(p + "i:s:" + s for s in JobStatus))
        assert not await client.exists(p + "i:t:summarize", p + "i:t:translate")
        translate = await engine.list_jobs(type="translate")
        assert [job.task_id for job in translate.jobs] == [other]
        completed = await engine.list_jobs(status=JobStatus.COMPLETED)
        assert [job.task_id for job in completed.jobs] == [done]
        await assert_each_job_in_one_layout(client, prefix, every)
        assert all([await client.hget(p + "j:" + t, "_fc") == b"10000" for t in every])
        assert await engine.tenant_in_flight("default") == 9  # 1 running, 6 ready, 2 delayed
        listed = await engine.list_jobs(tenant="default", limit=50)
        assert {job.task_id for job in listed.jobs} == every
        assert all(job.tenant == "default" for job in listed.jobs)
        # Jobs from before pipelines have no parent (no field: null), and children of theirs
        # enqueued now are listed and counted open like any.
        assert all(job.parent_id is None for job in listed.jobs)
        assert not await client.exists(p + "open")
        assert await engine.has_open_children(first) is False
        kid, _ = await engine.enqueue(new_job(now=T0, run_at=T0 + 1000, parent_id=first))
        assert [j.task_id for j in (await engine.list_jobs(parent_id=first)).jobs] == [kid.task_id]
        assert await engine.has_open_children(first) is True
        await engine.cancel(kid.task_id, now=T0)
        assert await engine.has_open_children(first) is False
        queued = await engine.list_jobs(tenant="default", status=JobStatus.QUEUED)
        assert {job.task_id for job in queued.jobs} == every - {running, done, dead}

        # The running job's lease carries on: its worker renews it and finishes it.
        assert await engine.heartbeat("w1", {running: 1}, now=T0, lease_s=LEASE) == {running: 1}
        job = await engine.finish(running, 1, Complete({"ok": 1}), now=T0 + 5)
        assert job.status == JobStatus.COMPLETED and job.history[0].started_at == T0 - 50
        assert await engine.tenant_in_flight("default") == 8

        assert await claim_all(engine, now=T0 + 10) == [urgent, first, other, tie, second, late]
        assert await claim_all(engine, now=T0 + 150) == [soon]
        assert await claim_all(engine, now=T0 + 250) == [later]
        assert await engine.tenant_in_flight("default") == 8  # all processing now

        # The dead job can be replayed (it has a fair cost) and counts in flight again.
        assert (await engine.replay(dead, now=T0 + 300, extra_attempts=1)).status == "queued"
        assert await engine.tenant_in_flight("default") == 9
        (again,) = await engine.claim("w2", limit=5, now=T0 + 300, lease_s=LEASE)
        assert again.task_id == dead and again.attempts == 2
    finally:
        await engine.close()


async def test_a_job_running_across_the_upgrade_handed_back_is_first_in_its_line(
    client: Redis, prefix: str
) -> None:
    old = OldRelease(client, prefix)
    running = await old.enqueue(now=T0 - 10)
    await old.claim(running, "w1", now=T0 - 5)
    waiting = [await old.enqueue(now=T0 + n) for n in range(3)]
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        job = await engine.finish(running, 1, Release("shutdown"), now=T0 + 5)
        assert job.status == JobStatus.QUEUED
        assert await claim_all(engine, now=T0 + 10) == [running, *waiting]
        assert await engine.tenant_in_flight("default") == 4
    finally:
        await engine.close()


async def test_a_second_connect_reads_one_key_and_changes_nothing(
    client: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await old_store(OldRelease(client, prefix), ready=5, delayed=2)
    first = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await first.connect()
    await first.close()
    before = await dump(client, prefix)

    sent: list[tuple[Any, ...]] = []
    call = RedisLink.call

    async def spy(self: RedisLink, *args: Any, **options: bool) -> Any:
        sent.append(args)
        return await call(self, *args, **options)

    monkeypatch.setattr(RedisLink, "call", spy)
    second = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await second.connect()
    await second.connect()  # connected already: nothing at all
    await second.close()
    # (and INFO memory, which reads no key: the eviction policy, redis_eviction; and two
    # empty PUBLISHes, which write none: whether the user may use the prefix's channels)
    assert [args for args in sent if args[0] not in ("SCRIPT", "FUNCTION")] == [
        ("GET", "{" + prefix + "}:layout"),
        ("INFO", "memory"),
        ("PUBLISH", "{" + prefix + "}:wake", ""),
        ("PUBLISH", "{" + prefix + "}:hand:-", ""),
    ]
    assert await dump(client, prefix) == before


async def test_a_new_store_only_gets_the_layout_key(client: Redis, prefix: str) -> None:
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    await engine.close()
    assert await dump(client, prefix) == {"{" + prefix + "}:layout": LAYOUT}


async def test_a_store_of_this_layout_without_the_key_is_only_walked(
    client: Redis, prefix: str
) -> None:
    """Jobs that have a tenant are of this layout: the walk leaves them as they are (counted
    in flight once, in their queues once) and their fair-share state too."""
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        for n in range(3):
            await engine.enqueue(new_job(now=T0 + n, tenant="acme"))
        await engine.enqueue(new_job(now=T0, run_at=T0 + 100))
        assert len(await engine.claim("w1", limit=1, now=T0, lease_s=LEASE)) == 1
    finally:
        await engine.close()
    await client.delete("{" + prefix + "}:layout")
    before = await dump(client, prefix)
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    await engine.close()
    after = await dump(client, prefix)
    assert after.pop("{" + prefix + "}:layout") == LAYOUT
    assert after == before


async def test_a_store_of_layout_2_loses_its_indexes_by_status_and_by_type_alone(
    client: Redis, prefix: str
) -> None:
    """Layout 2 differs from this one only by the listing indexes by status alone
    ({bb}:i:s:<status>) and by type alone ({bb}:i:t:<type>), which held what the indexes by
    both hold: a store of it is this layout's with those written in and layout '2' recorded.
    One step drops them and records this layout; nothing else changes, and listings by status
    or by type alone give what layout 2 gave."""
    p = "{" + prefix + "}:"
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        ids = [
            (await engine.enqueue(new_job(ty, now=T0 + n)))[0].task_id
            for n, ty in enumerate(["gen", "embed", "gen", "gen"])
        ]
        (claimed,) = await engine.claim("w1", limit=1, now=T0 + 9, types=["embed"], lease_s=LEASE)
        await engine.finish(claimed.task_id, claimed.fence, Complete(1), now=T0 + 10)
        (running,) = await engine.claim("w1", limit=1, now=T0 + 11, lease_s=LEASE)
    finally:
        await engine.close()
    before = await dump(client, prefix)
    for key, members in list(before.items()):
        parts = key.removeprefix(p).split(":")
        if parts[:2] == ["i", "st"]:
            await client.zadd(p + "i:s:" + parts[2], dict(members))
            await client.zadd(p + "i:t:" + ":".join(parts[3:]), dict(members))
    await client.set(p + "layout", "2")
    assert await client.exists(p + "i:s:queued", p + "i:t:gen", p + "i:t:embed") == 3

    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        after = await dump(client, prefix)
        assert after.pop(p + "layout") == LAYOUT
        before.pop(p + "layout")
        assert after == before
        queued = await engine.list_jobs(status=JobStatus.QUEUED)
        assert [job.task_id for job in queued.jobs] == [ids[3], ids[2]]
        gen = await engine.list_jobs(type="gen")
        assert [job.task_id for job in gen.jobs] == [ids[3], ids[2], ids[0]]
        assert running.task_id == ids[0]
        stats = await engine.stats(now=T0 + 12)
        assert stats.counts[JobStatus.QUEUED] == 2
        assert stats.counts[JobStatus.PROCESSING] == stats.counts[JobStatus.COMPLETED] == 1
    finally:
        await engine.close()


async def test_a_store_of_the_first_tenants_release_keeps_its_fair_order(
    client: Redis, prefix: str
) -> None:
    """The first tenants release (8319ca4, which recorded no layout) kept the fair-share state
    of every type in one hash, ``{bb}:fair``: ``<pq>``, the priority's clock, and
    ``<pq>:<tenant>``, the tenant's last tag there. The walk carries it over to the hash of
    each type from the jobs in flight (a queue's clock opens at the priority's, a tenant's last
    tag is its latest job's in that queue) and the last batch deletes it, so jobs enqueued
    after the upgrade queue up behind the ones from before, not ahead of them."""
    p = "{" + prefix + "}:"
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        gen = [await engine.enqueue(new_job("gen", now=T0, tenant="acme")) for _ in range(4)]
        embed = [await engine.enqueue(new_job("embed", now=T0, tenant="globex")) for _ in range(2)]
        running = await engine.claim("w1", limit=2, now=T0, lease_s=LEASE, types=["gen"])
    finally:
        await engine.close()
    acme, globex = [job.task_id for job, _ in gen], [job.task_id for job, _ in embed]
    assert [job.task_id for job in running] == acme[:2]
    # As 8319ca4 left it: tags from one clock per priority, kept in one hash.
    await client.delete(p + "layout", p + "fair:gen", p + "fair:embed")
    await client.hset(
        p + "fair", mapping={"100": "20000", "100:acme": "40000", "100:globex": "20000"}
    )

    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        assert await client.get(p + "layout") == LAYOUT
        assert not await client.exists(p + "fair", p + "upgrade", p + "upgrade:ready")
        assert await client.hgetall(p + "fair:gen") == {b"100": b"20000", b"100:acme": b"40000"}
        assert await client.hgetall(p + "fair:embed") == {
            b"100": b"20000",
            b"100:globex": b"20000",
        }
        assert await engine.tenant_in_flight("acme") == 4
        # New jobs go behind the old ones of their tenant, and level with the others'.
        acme_new = await engine.enqueue(new_job("gen", now=T0, tenant="acme"))
        initech = await engine.enqueue(new_job("gen", now=T0, tenant="initech"))
        late = await engine.enqueue(new_job("embed", now=T0, tenant="initech"))
        await engine.finish(acme[0], 1, Release("shutdown"), now=T0 + 1)  # first again
        order = [job.task_id for job in await engine.claim("w2", limit=9, now=T0 + 1, lease_s=1)]
        assert order == [
            acme[0],
            globex[0],
            globex[1],
            acme[2],
            initech[0].task_id,
            late[0].task_id,
            acme[3],
            acme_new[0].task_id,
        ]
    finally:
        await engine.close()


async def test_a_store_of_a_later_layout_is_refused(client: Redis, prefix: str) -> None:
    await client.set("{" + prefix + "}:layout", LAYOUT_VERSION + 1)
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    with pytest.raises(ConfigurationError, match="cannot read"):
        await engine.connect()
    with pytest.raises(Exception, match="not connected"):
        await engine.get("task_x")


@pytest.mark.parametrize(("cut_after", "tagging"), [(1, False), (5, False), (12, True)])
async def test_an_upgrade_cut_short_finishes_on_the_next_connect(
    client: Redis, prefix: str, cut_after: int, tagging: bool
) -> None:
    old = OldRelease(client, prefix)
    running = await old.enqueue(now=T0 - 10)
    done = await old.enqueue(now=T0 - 10)
    for task_id in (running, done):
        await old.claim(task_id, "w1", now=T0 - 5)
    await old.complete(done, now=T0 - 4)
    order, later = await old_store(old, ready=30, delayed=4)
    every = {running, done, *order, *later}
    p = "{" + prefix + "}:"

    # 36 jobs, 4 a batch: the walk takes 9 batches (the 10th finds it over and starts
    # tagging), then 30 ready jobs take 8 more: cut in the walk's first batch, in its middle,
    # and half-way through the tagging; each batch leaves each job in one layout or the other.
    pool = ConnectionPool.from_url(REDIS_TEST_URL)
    link = RedisLink(pool, where="test")
    link.start()
    try:
        for _ in range(cut_after):
            await upgrade_layout(link, p, where="test", batch=4, max_batches=1)
            await assert_each_job_in_one_layout(client, prefix, every)
        assert await client.get(p + "layout") is None
        assert (await client.hget(p + "upgrade", "scanned") == b"1") is tagging
        assert 0 < await client.zcard(p + "upgrade:ready") < 30
    finally:
        await link.close()
        await pool.disconnect()

    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    engine.upgrade_batch = 4
    await engine.connect()
    try:
        assert await client.get(p + "layout") == LAYOUT
        assert not await client.exists(p + "upgrade", p + "upgrade:ready")
        await assert_each_job_in_one_layout(client, prefix, every)
        assert await engine.tenant_in_flight("default") == 1 + 30 + 4
        assert await claim_all(engine, now=T0 + 20) == order
        assert await claim_all(engine, now=T0 + 200) == later
        listed = await engine.list_jobs(tenant="default", limit=100)
        assert {job.task_id for job in listed.jobs} == every
    finally:
        await engine.close()


async def test_processes_connecting_at_once_share_the_upgrade(
    client: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    order, later = await old_store(OldRelease(client, prefix), ready=40, delayed=5)
    looked_at: list[int] = []
    upgrade = redis_backend.upgrade_layout

    async def counting(*args: Any, **kwargs: Any) -> int:
        looked_at.append(await upgrade(*args, **kwargs))
        return looked_at[-1]

    monkeypatch.setattr(redis_backend, "upgrade_layout", counting)
    engines = [RedisBackend(REDIS_TEST_URL, prefix=prefix) for _ in range(3)]
    for engine in engines:
        engine.upgrade_batch = 3

    async def connect(engine: RedisBackend) -> bytes | None:
        await engine.connect()
        return await client.get("{" + prefix + "}:layout")

    # Three processes, one of them connecting twice at once: every connect() returns only
    # once the store is up to date.
    connected = await asyncio.gather(*(connect(engine) for engine in [*engines, engines[0]]))
    try:
        assert connected == [LAYOUT] * 4
        # Each job was looked at once, by whichever process's batch came to it.
        assert sum(looked_at) == 45 and sum(n > 0 for n in looked_at) > 1, looked_at
        await assert_each_job_in_one_layout(client, prefix, {*order, *later})
        assert await claim_all(engines[1], now=T0 + 20) == order
        assert await claim_all(engines[2], now=T0 + 200) == later
        assert await engines[0].tenant_in_flight("default") == 45
    finally:
        for engine in engines:
            await engine.close()


async def test_jobs_a_newer_release_dropped_from_the_old_queues_are_queued_again(
    client: Redis, prefix: str
) -> None:
    """Run on an old store, the previous release of the tenants layout took old ready members
    apart (its claim removed them, then failed) and dropped old delayed entries: the jobs
    stayed queued in their hashes, in no queue. The upgrade puts them back."""
    old = OldRelease(client, prefix)
    ready = await old.enqueue(now=T0)
    delayed = await old.enqueue(now=T0, run_at=T0 + 100)
    p = "{" + prefix + "}:"
    await client.delete(p + "r:summarize", p + "delayed")
    engine = RedisBackend(REDIS_TEST_URL, prefix=prefix)
    await engine.connect()
    try:
        await assert_each_job_in_one_layout(client, prefix, {ready, delayed})
        assert await claim_all(engine, now=T0 + 10) == [ready]
        assert await claim_all(engine, now=T0 + 100) == [delayed]
    finally:
        await engine.close()
