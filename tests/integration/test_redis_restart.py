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


async def test_a_redis_that_restarts_with_an_evicting_policy_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require_redis_backend()
    server = RedisServer(tmp_path / "redis", appendonly=False)
    try:
        server.start()
        bb = noop_app(server.url("rp"))
        caplog.set_level(logging.INFO, logger="backburner.redis")
        async with bb:
            backend = bb.backend
            assert isinstance(backend, RedisBackend)
            assert backend.eviction_policy == "noeviction"
            server.kill()
            server.config += ("--maxmemory", "1gb", "--maxmemory-policy", "volatile-lru")
            server.start()
            await enqueue_retrying(bb, "noop", {})
            await eventually(
                lambda: backend.eviction_policy == "volatile-lru",
                message="the restarted Redis's policy read",
            )
        warned = [
            r.getMessage()
            for r in caplog.records
            if r.name == "backburner.redis" and r.levelno == logging.WARNING
        ]
        (policy,) = [w for w in warned if "maxmemory-policy" in w]  # the restarted one's
        assert "maxmemory-policy volatile-lru" in policy
        assert "finished jobs with their results" in policy
    finally:
        server.stop()
