"""A Redis that needs a password: without one, or with a wrong one, a process is refused at
connect with what to do, in one line from the CLI; with it, it connects."""

from __future__ import annotations

import pytest
from redis import Redis

from backburner.errors import BackendError

from ..chaos.support import RedisServer
from ..unit.test_cli import assert_one_line_error, run
from .conftest import noop_app

PASSWORD = "s3cret-pw"


@pytest.fixture
def guarded_redis(own_redis: RedisServer, own_admin: Redis) -> RedisServer:
    # (started open, as its start waits for a PING; the password from now on)
    own_admin.config_set("requirepass", PASSWORD)
    return own_redis


async def test_without_the_password_connect_says_to_give_it(guarded_redis: RedisServer) -> None:
    bb = noop_app(guarded_redis.url("auth"))
    with pytest.raises(BackendError) as refused:
        await bb.connect()
    message = str(refused.value)
    assert message.startswith(f"cannot connect to Redis at 127.0.0.1:{guarded_redis.port}: ")
    assert "NOAUTH" in message
    assert "Give its password in the URL, as [user]:PASSWORD@ before the host." in message


async def test_with_a_wrong_password_connect_is_refused_without_showing_it(
    guarded_redis: RedisServer,
) -> None:
    bb = noop_app(f"redis://:not-it@127.0.0.1:{guarded_redis.port}/0?prefix=auth")
    with pytest.raises(BackendError, match="invalid username-password pair") as refused:
        await bb.connect()
    assert "not-it" not in str(refused.value)


async def test_with_the_password_jobs_are_stored(guarded_redis: RedisServer) -> None:
    bb = noop_app(f"redis://:{PASSWORD}@127.0.0.1:{guarded_redis.port}/0?prefix=auth")
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
        "NOAUTH Authentication required. Give its password in the URL, as [user]:PASSWORD@ "
        "before the host.",
    )
