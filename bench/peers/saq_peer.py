"""saq: asyncio jobs in Redis; worker ``saq peers.saq_peer.settings`` (concurrency from
BENCH_CONCURRENCY)."""

from __future__ import annotations

from typing import Any

from saq import Queue

from . import common
from .ctx_tasks import nap, noop, ping


def settings() -> dict[str, Any]:
    """The worker's settings (a callable, so the queue is made inside the worker process)."""
    return {
        "queue": Queue.from_url(common.REDIS_URL),
        "functions": [noop, ping, nap],
        "concurrency": common.concurrency(),
    }


class Peer(common.AsyncPeer):
    name = "saq"
    dists = ("saq",)
    setup = (
        "Queue.from_url, job state kept in Redis. Each idle concurrency slot blocks in its own "
        "BLMOVE, so holds its own Redis connection: 10,000 slots need about 10,000."
    )

    async def connect(self) -> Queue:
        queue = Queue.from_url(common.REDIS_URL)
        await queue.connect()
        return queue

    async def submit(self, client: Queue, task: str) -> None:
        await client.enqueue(task)

    async def close(self, client: Queue) -> None:
        await client.disconnect()

    def workers(self, scenario: str, count: int) -> list[common.WorkerSpec]:
        jobs = 10 if scenario in ("drain", "pickup") else count  # 10 (its default) drains fastest
        argv = [common.tool("saq"), "peers.saq_peer.settings", "--quiet"]
        label = f"concurrency={common.shown(scenario, jobs)}"
        return [common.WorkerSpec(label, argv, {"BENCH_CONCURRENCY": str(jobs)})]
