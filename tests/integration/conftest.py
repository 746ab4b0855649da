"""Fixtures of the Redis integration tests: a connected backend under a prefix of its own, and
a raw client of the same Redis (both skip without Redis, and fail under CI=true)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from backburner.backends.redis import RedisBackend

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
