"""Fixtures of the Redis integration tests: a connected backend under a prefix of its own, and
a raw client of the same Redis (both skip without Redis, and fail under CI=true); a
redis-server of a test's own; an app with a no-op task."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from backburner import Backburner, JobContext
from backburner.backends import backend_from_url
from backburner.backends.redis import RedisBackend

from ..chaos.support import RedisServer, started_redis
from ..conftest import REDIS_TEST_URL, drop_redis_keys, require_redis


@pytest.fixture
async def engine() -> AsyncIterator[RedisBackend]:
    require_redis()
    backend = RedisBackend(REDIS_TEST_URL, prefix="test-" + uuid.uuid4().hex[:12])
    await backend.connect()
    try:
        yield backend
    finally:
        await backend.close()
        await drop_redis_keys(backend)


@pytest.fixture
async def client() -> AsyncIterator[Redis]:
    require_redis()
    connection = Redis.from_url(REDIS_TEST_URL)
    try:
        yield connection
    finally:
        await connection.aclose()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (no persistence), to reconfigure at will."""
    yield from started_redis(tmp_path)


@pytest.fixture
def own_admin(own_redis: RedisServer) -> Iterator[SyncRedis]:
    """A blocking client of ``own_redis``, closed after the test."""
    with SyncRedis(port=own_redis.port) as client:
        yield client


def noop_app(url: str, *, functions: bool = True) -> Backburner:
    """An app on the Redis backend of ``url`` with one task, ``noop`` (``functions`` False:
    its scripts go by EVALSHA)."""
    backend = backend_from_url(url)
    assert isinstance(backend, RedisBackend)
    backend.functions = functions
    bb = Backburner(backend)

    @bb.task()
    async def noop(ctx: JobContext) -> None:
        return None

    return bb
