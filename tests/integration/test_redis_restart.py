"""A Redis that restarts empty (no persistence) is reported, once, by the processes that find
it out; one that restarts with its keys is not. Either way the jobs enqueued after are kept."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from backburner import JobStatus
from backburner.backends.redis import RedisBackend
from backburner.backends.redis_upgrade import LAYOUT_KEY, LAYOUT_VERSION
from backburner.errors import JobNotFoundError

from ..chaos.support import RedisServer, require_redis_backend
from ..helpers import eventually
from .conftest import noop_app
from .test_redis_sentinel import enqueue_retrying

LOST = "has lost every key of prefix 'rs'"


@pytest.fixture(params=[False, True], ids=["no-persistence", "appendonly"])
def restarting_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    require_redis_backend()
    # (appendfsync always: with everysec Redis may answer a write it has not yet handed to the
    # OS, while an fsync runs, and a kill -9 loses it; this test is about the report)
    config = ("--appendfsync", "always") if request.param else ()
    server = RedisServer(tmp_path / "redis", appendonly=request.param, config=config)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "backburner.redis" and r.levelno == logging.ERROR
    ]


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
async def test_a_restart_that_lost_the_keys_is_reported_once_and_the_store_goes_on(
    restarting_redis: RedisServer, functions: bool, caplog: pytest.LogCaptureFixture
) -> None:
    persistent = restarting_redis.appendonly
    bb = noop_app(restarting_redis.url("rs"), functions=functions)
    caplog.set_level(logging.INFO, logger="backburner.redis")
    async with bb:
        before = await bb.enqueue("noop")
        restarting_redis.kill()
        restarting_redis.start()
        after, _ = await enqueue_retrying(bb, "noop", {})
        # A second script after the restart: the first found the code gone, this one does not.
        also = await bb.enqueue("noop")
        assert (await bb.get(after.task_id)).status == JobStatus.QUEUED
        assert (await bb.get(also.task_id)).status == JobStatus.QUEUED
        if persistent:
            assert (await bb.get(before.task_id)).status == JobStatus.QUEUED
            assert _reports(caplog) == []
        else:
            await eventually(lambda: _reports(caplog) != [], message="the loss reported")
            (report,) = _reports(caplog)
            assert LOST in report and f"127.0.0.1:{restarting_redis.port}" in report
            assert "appendonly yes" in report
            with pytest.raises(JobNotFoundError):
                await bb.get(before.task_id)
        # Marked as a store of this layout again: a process connecting now takes it as is.
        with Redis(port=restarting_redis.port) as admin:
            layout = admin.get("{rs}:" + LAYOUT_KEY)
        assert layout == str(LAYOUT_VERSION).encode()


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
async def test_the_eviction_policy_is_read_again_after_a_restart_and_reported_when_it_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, functions: bool
) -> None:
    require_redis_backend()
    evicting = ("--maxmemory", "1gb", "--maxmemory-policy")
    server = RedisServer(tmp_path / "redis", appendonly=False, config=(*evicting, "volatile-lru"))
    try:
        server.start()
        bb = noop_app(server.url("rp"), functions=functions)
        caplog.set_level(logging.INFO, logger="backburner.redis")
        async with bb:
            backend = bb.backend
            assert isinstance(backend, RedisBackend)
            assert backend.eviction_policy == "volatile-lru"
            # Restarted as it was: each script finds its code gone; none reports the policy.
            server.kill()
            server.start()
            job, _ = await enqueue_retrying(bb, "noop", {})
            await bb.cancel(job.task_id)
            await bb.enqueue("noop")
            await eventually(lambda: len(_reports(caplog)) == 1, message="the first loss")
            # Restarted with another policy: that is reported.
            server.kill()
            server.config = (*evicting, "allkeys-lru")
            server.start()
            await enqueue_retrying(bb, "noop", {})
            await eventually(
                lambda: backend.eviction_policy == "allkeys-lru",
                message="the restarted Redis's policy read",
            )
        policies = [
            r.getMessage()
            for r in caplog.records
            if r.name == "backburner.redis"
            and r.levelno == logging.WARNING
            and "maxmemory-policy" in r.getMessage()
        ]
        assert len(policies) == 2, policies
        assert "maxmemory-policy volatile-lru" in policies[0]
        assert "finished jobs with their results" in policies[0]
        assert "maxmemory-policy allkeys-lru" in policies[1]
        assert "queued and running ones included" in policies[1]
    finally:
        server.stop()
