"""A real worker of an app on a Redis key prefix of its own, for the Redis integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from backburner import Backburner, Settings
from backburner.backends.redis import RedisBackend
from backburner.worker.runner import Worker

from ..conftest import REDIS_TEST_URL, drop_redis_keys, require_redis


def redis_app() -> Backburner:
    """An app on the test Redis under a fresh prefix (skips without Redis; fails under CI)."""
    require_redis()
    url = f"{REDIS_TEST_URL}?prefix=test-{uuid.uuid4().hex[:12]}"
    return Backburner(url, settings=Settings(backend_url=url, idle_wait_s=5.0))


def count_claims(app: Backburner) -> list[int]:
    """How many jobs each of the app's claims from now on took, in order."""
    claims: list[int] = []
    claim = app.backend.claim

    async def counted(*args: object, **kwargs: object) -> object:
        jobs = await claim(*args, **kwargs)  # type: ignore[arg-type]
        claims.append(len(jobs))
        return jobs

    app.backend.claim = counted  # type: ignore[method-assign]
    return claims


@contextlib.asynccontextmanager
async def running_worker(app: Backburner, concurrency: int) -> AsyncIterator[Worker]:
    """A worker of ``app`` running (started) until the block ends; then it is shut down, the
    app closed and the prefix's keys dropped."""
    worker = Worker(app, concurrency=concurrency)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.started.wait(), 10)
        yield worker
    finally:
        try:
            if not worker._stopping.is_set():  # (a second shutdown would force it)
                worker.shutdown()
            await asyncio.wait_for(running, 20)
        finally:
            # Closed even when the worker did not stop (a test failed with a hook held): a
            # connection left open keeps uvloop's loop.close() from returning, and the run.
            await app.close()
            await drop_redis_keys(app.backend)


async def registered(client: Redis, engine: RedisBackend, worker_id: str) -> None:
    """Until worker_id is registered as idle (polled: the registration is the wait's doing)."""
    key = "{" + engine.prefix + "}:idlew"
    for _ in range(500):
        if await client.hexists(key, worker_id):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{worker_id} never registered as idle")
