"""A Redis that may evict keys is warned about at connect, and when it is set to while a backend
is connected. One that is full (noeviction, past maxmemory) refuses an enqueue whole, as a
BackendError, and still serves reads and deletes."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from redis import Redis

from backburner import Backburner, JobContext, JobStatus
from backburner.backends import backend_from_url, redis_eviction
from backburner.backends.base import Complete
from backburner.backends.redis import RedisBackend
from backburner.backends.redis_link import RedisLink
from backburner.errors import BackendError, JobNotFoundError

from ..chaos.support import RedisServer
from ..conformance._support import T0, new_job
from ..helpers import eventually
from .conftest import noop_app


def _query_buffers_settled(admin: Redis) -> bool:
    """No client holds a query buffer much larger than a command of ours needs."""
    return all(int(client["qbuf-free"]) <= 64 * 1024 for client in admin.client_list())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "backburner.redis" and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize(
    ("policy", "at_risk"),
    [
        ("noeviction", None),
        ("volatile-lru", "finished jobs with their results"),
        ("volatile-ttl", "webhooks still to be delivered"),
        ("allkeys-lru", "queued and running ones included"),
        ("allkeys-random", "queued and running ones included"),
    ],
)
async def test_a_backend_warns_at_connect_when_redis_may_evict_its_keys(
    own_redis: RedisServer,
    own_admin: Redis,
    caplog: pytest.LogCaptureFixture,
    policy: str,
    at_risk: str | None,
) -> None:
    own_admin.config_set("maxmemory-policy", policy)
    own_admin.config_set("maxmemory", "1gb")
    backend = backend_from_url(own_redis.url("ev"))
    assert isinstance(backend, RedisBackend)
    with caplog.at_level(logging.WARNING, logger="backburner.redis"):
        await backend.connect()
    try:
        assert backend.eviction_policy == policy
        warned = _warnings(caplog)
        if at_risk is None:
            assert warned == []
        else:
            assert len(warned) == 1
            assert f"maxmemory-policy {policy}" in warned[0]
            assert at_risk in warned[0]
            assert "Set maxmemory-policy noeviction" in warned[0]
            assert f"127.0.0.1:{own_redis.port}" in warned[0]
    finally:
        await backend.close()


async def test_without_maxmemory_nothing_is_evicted_and_nothing_is_warned(
    own_redis: RedisServer, own_admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    own_admin.config_set("maxmemory-policy", "allkeys-lru")  # (maxmemory 0: no limit)
    backend = backend_from_url(own_redis.url("ev"))
    assert isinstance(backend, RedisBackend)
    with caplog.at_level(logging.INFO, logger="backburner.redis"):
        await backend.connect()
    await backend.close()
    assert backend.eviction_policy == "allkeys-lru"
    assert _warnings(caplog) == []
    assert any("but no maxmemory set" in r.getMessage() for r in caplog.records)


async def test_a_change_made_while_connected_is_reported_once_by_the_next_reads(
    own_redis: RedisServer,
    own_admin: Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = 0
    read = redis_eviction.read_eviction

    async def counted(link: RedisLink, where: str) -> redis_eviction.Eviction | None:
        nonlocal reads
        reads += 1
        return await read(link, where)

    monkeypatch.setattr(redis_eviction, "read_eviction", counted)
    own_admin.config_set("maxmemory-policy", "allkeys-lru")  # (no maxmemory yet: no eviction)
    backend = backend_from_url(own_redis.url("ev"))
    assert isinstance(backend, RedisBackend)
    backend.eviction_recheck_s = 0.02
    with caplog.at_level(logging.INFO, logger="backburner.redis"):
        await backend.connect()
        try:
            assert _warnings(caplog) == []
            # As a managed Redis applies a change of its parameters: no restart.
            own_admin.config_set("maxmemory", "1gb")
            await eventually(lambda: _warnings(caplog) != [], message="the change reported")
            seen = reads
            await eventually(lambda: reads >= seen + 3, message="three more reads")
        finally:
            await backend.close()
    (warned,) = _warnings(caplog)
    assert "maxmemory-policy allkeys-lru" in warned
    assert "queued and running ones included" in warned


async def test_a_user_who_may_not_read_info_connects_without_a_warning(
    own_redis: RedisServer, own_admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    admin = own_admin
    admin.config_set("maxmemory-policy", "allkeys-lru")
    admin.config_set("maxmemory", "1gb")
    admin.execute_command(
        "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info", "-config"
    )
    bb = noop_app(f"redis://app:secret@127.0.0.1:{own_redis.port}/0?prefix=ev")
    with caplog.at_level(logging.DEBUG, logger="backburner.redis"):
        async with bb:
            job = await bb.enqueue("noop")
            assert (await bb.get(job.task_id)).task_id == job.task_id
    assert _warnings(caplog) == []
    assert isinstance(bb.backend, RedisBackend) and bb.backend.eviction_policy is None
    assert any("cannot read its maxmemory-policy" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
async def test_a_full_redis_refuses_writes_whole_and_still_serves_reads_and_deletes(
    own_redis: RedisServer, own_admin: Redis, functions: bool
) -> None:
    admin = own_admin
    admin.config_set("maxmemory-policy", "noeviction")
    backend = backend_from_url(own_redis.url("full"))
    assert isinstance(backend, RedisBackend)
    backend.functions = functions
    bb = Backburner(backend)

    @bb.task()
    async def echo(ctx: JobContext, text: str) -> str:
        return text

    async with bb:
        now = bb.clock.now
        running = await bb.enqueue("echo", {"text": "running"})
        finished = await bb.enqueue("echo", {"text": "finished"})
        claimed = await backend.claim("w1", limit=2, now=now(), lease_s=60, types=["echo"])
        assert {job.task_id for job in claimed} == {running.task_id, finished.task_id}
        fence = {job.task_id: job.fence for job in claimed}
        await backend.finish(
            finished.task_id, fence[finished.task_id], Complete("y" * 300_000), now=now()
        )
        # Redis keeps a query buffer the size of a fat argument on the connection that sent it
        # (it expects another) until its clients' cron frees it, 0.1-0.2 s later: 330 KB of
        # used_memory that vanish. Measured before, the limits below moved by that much under
        # the test (the heartbeat past "maxmemory" found Redis under it).
        await eventually(lambda: _query_buffers_settled(admin), message="fat buffers freed")

        # Room for a few hundred jobs beyond what Redis holds now (the library, the layout).
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 400_000)
        stored = 0
        with pytest.raises(BackendError, match="OOM command not allowed") as refused:
            for _ in range(5_000):
                await bb.enqueue("echo", {"text": "x" * 500})
                stored += 1
        assert "Redis refused a command" in str(refused.value)
        assert 50 < stored < 5_000
        # Every count and index says what was acknowledged: the refused enqueue wrote nothing.
        queued = stored + 2
        assert int(admin.get("{full}:seq")) == queued
        assert admin.zcard("{full}:i:all") == queued
        assert admin.zcard("{full}:r:echo") == stored
        assert int(admin.hget("{full}:inflight", "default")) == stored + 1
        assert len(admin.keys("{full}:j:*")) == queued

        # Well past maxmemory from here (replies and buffers make used_memory wobble).
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) - 150_000)

        # Full, it still answers reads.
        assert (await bb.get(running.task_id)).status == JobStatus.PROCESSING
        assert [e.seq for e in await bb.events(finished.task_id)] == [1, 2, 3]
        page = await bb.list(status="queued", limit=5)
        assert len(page.jobs) == 5 and all(j.status == JobStatus.QUEUED for j in page.jobs)
        assert await bb.in_flight() == stored + 1
        # As functions (allow-oom), a heartbeat renews the running job's lease; by EVALSHA,
        # Redis refuses its first write (HSET), before it changed anything.
        lease_before = (await bb.get(running.task_id)).lease_expires_at
        held = {running.task_id: fence[running.task_id]}
        if functions:
            # Waiting for a job's events (SSE, wait) gives it a stream first: allowed too.
            heads = await backend.wait_for_events({running.task_id: 0}, timeout=1.0)
            assert heads == {running.task_id: 2}  # queued, processing
            assert await backend.heartbeat("w1", held, now=now() + 5, lease_s=60) == held
            assert (await bb.get(running.task_id)).lease_expires_at != lease_before
        else:
            with pytest.raises(BackendError, match="OOM"):
                await backend.heartbeat("w1", held, now=now() + 5, lease_s=60)
            assert (await bb.get(running.task_id)).lease_expires_at == lease_before
        if functions:
            # A result is a write: refused whole, the job processing under the same fence.
            # (By EVALSHA, Redis looks at memory only at a script's first write, which for a
            # finish alone is a ZREM that takes none: the result is stored.)
            with pytest.raises(BackendError, match="OOM"):
                await backend.finish(
                    running.task_id, fence[running.task_id], Complete("z"), now=now()
                )
            assert (await bb.get(running.task_id)).status == JobStatus.PROCESSING

        # Deleting a finished job (its 300 KB result) frees room: the next enqueue is stored.
        await bb.delete(finished.task_id)
        with pytest.raises(JobNotFoundError):
            await bb.get(finished.task_id)
        await bb.enqueue("echo", {"text": "x" * 500})
        done = await backend.finish(
            running.task_id, fence[running.task_id], Complete("z"), now=now()
        )
        assert done.status == JobStatus.COMPLETED


async def test_a_queued_job_whose_hash_is_gone_leaves_the_queue_at_its_claim(
    engine: RedisBackend, client: Any
) -> None:
    # An allkeys policy may evict a queued job's hash: its claim wrote back a hash of a few
    # fields, processing for good, that no sweep could read (so none ever ended its lease).
    gone, _ = await engine.enqueue(new_job("noop"))
    kept, _ = await engine.enqueue(new_job("noop"))
    p = engine._p
    await client.delete(p + "j:" + gone.task_id, p + "s:" + gone.task_id)
    claimed = await engine.claim("w1", limit=10, now=T0, lease_s=60, types=["noop"])
    assert [job.task_id for job in claimed] == [kept.task_id]
    assert await client.exists(p + "j:" + gone.task_id) == 0  # not written back
    assert await client.zcard(p + "r:noop") == 0
    assert await client.zscore(p + "i:st:processing:noop", gone.task_id) is None
    assert await client.zscore(p + "leases", gone.task_id) is None
    stats = await engine.stats(now=T0)
    assert stats.queued_by_priority == {}  # its count went with it
