"""A Redis that needs a password: without one, or with a wrong one, a process is refused at
connect with what to do, in one line from the CLI; with it, it connects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from backburner import Backburner, JobContext
from backburner.errors import BackendError

from ..chaos.support import RedisServer, started_redis
from ..unit.test_cli import assert_one_line_error, run

PASSWORD = "s3cret-pw"


@pytest.fixture
def guarded_redis(tmp_path: Path) -> Iterator[RedisServer]:
    for server in started_redis(tmp_path):  # (started open: its start waits for a PING)
        Redis(port=server.port).config_set("requirepass", PASSWORD)
        yield server


def _app(url: str) -> Backburner:
    bb = Backburner(url)

    @bb.task()
    async def noop(ctx: JobContext) -> None:
        return None

    return bb


async def test_without_the_password_connect_says_to_give_it(guarded_redis: RedisServer) -> None:
    bb = _app(guarded_redis.url("auth"))
    with pytest.raises(BackendError) as refused:
        await bb.connect()
    message = str(refused.value)
    assert message.startswith(f"cannot connect to Redis at 127.0.0.1:{guarded_redis.port}: ")
    assert "NOAUTH" in message
    assert "Give its password in the URL: redis://[user]:PASSWORD@host:port/db." in message


async def test_with_a_wrong_password_connect_is_refused_without_showing_it(
    guarded_redis: RedisServer,
) -> None:
    bb = _app(f"redis://:not-it@127.0.0.1:{guarded_redis.port}/0?prefix=auth")
    with pytest.raises(BackendError, match="invalid username-password pair") as refused:
        await bb.connect()
    assert "not-it" not in str(refused.value)


async def test_with_the_password_jobs_are_stored(guarded_redis: RedisServer) -> None:
    bb = _app(f"redis://:{PASSWORD}@127.0.0.1:{guarded_redis.port}/0?prefix=auth")
    async with bb:
        job = await bb.enqueue("noop")
        assert (await bb.get(job.task_id)).task_id == job.task_id


def test_the_cli_refuses_in_one_line_and_prints_the_hint_as_text(
    guarded_redis: RedisServer,
) -> None:
    done = run("worker", "tests.workerapp:bb", "--backend", guarded_redis.url("auth"), timeout=60)
    # (the hint's "[user]" is not taken for markup)
    assert_one_line_error(
        done,
        "NOAUTH Authentication required. Give its password in the URL: "
        "redis://[user]:PASSWORD@host:port/db.",
    )
