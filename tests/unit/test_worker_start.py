"""A worker whose backend cannot take its first heartbeat waits for it."""

from __future__ import annotations

import asyncio
from typing import Any

from backburner import Backburner, JobContext
from backburner.errors import BackendError
from backburner.worker import Worker

from ..helpers import running_worker


async def test_a_worker_started_during_an_outage_waits_it_out() -> None:
    # Its first heartbeat's error ended it. Under serve, the API went on answering (ready)
    # with no worker, and every job stayed queued (a review: a SQLite lock held 35 s).
    bb = Backburner("memory://")

    @bb.task
    async def echo(ctx: JobContext, n: int) -> int:
        return n

    heartbeat = bb.backend.heartbeat
    refused = 0

    async def locked(*args: Any, **kwargs: Any) -> Any:
        nonlocal refused
        if refused < 3:
            refused += 1
            raise BackendError("sqlite: database is locked")
        return await heartbeat(*args, **kwargs)

    bb.backend.heartbeat = locked  # type: ignore[method-assign]
    async with bb, running_worker(bb, concurrency=1):
        done = await bb.wait((await bb.enqueue("echo", {"n": 7})).task_id, timeout=30)
    assert refused == 3
    assert done.status == "completed" and done.result == 7


async def test_a_worker_told_to_stop_while_it_waits_to_start_stops() -> None:
    bb = Backburner("memory://")

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendError("Redis at 127.0.0.1:1: connection refused")

    bb.backend.heartbeat = down  # type: ignore[method-assign]
    async with bb:
        worker = Worker(bb)
        run = asyncio.create_task(worker.run())
        worker.shutdown()
        await asyncio.wait_for(run, 10)
