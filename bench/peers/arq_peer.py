"""arq: asyncio jobs in Redis; worker ``arq peers.arq_peer.WorkerSettings``.

Knobs come from the environment the benchmark sets: BENCH_CONCURRENCY (max_jobs) and
BENCH_POLL_DELAY (seconds between polls of an empty queue, arq's default 0.5).
"""

from __future__ import annotations

import os

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from . import common
from .ctx_tasks import nap, noop, ping

REDIS = RedisSettings(host="127.0.0.1", port=6379, database=common.REDIS_DB)


class WorkerSettings:
    functions = [noop, ping, nap]
    redis_settings = REDIS
    max_jobs = common.concurrency()
    poll_delay = float(os.environ.get("BENCH_POLL_DELAY", "0.5"))


class Peer(common.AsyncPeer):
    name = "arq"
    dists = ("arq",)
    setup = (
        "enqueue_job; results kept 1 h (default). An idle worker polls the queue every "
        "poll_delay (0.5 s by default); the pickup loop's 20-50 ms gaps between jobs stay in "
        "phase with so long a poll, so the default's p50 is near its worst case, not its mean."
    )

    async def connect(self) -> ArqRedis:
        return await create_pool(REDIS)

    async def submit(self, client: ArqRedis, task: str) -> None:
        await client.enqueue_job(task)

    async def close(self, client: ArqRedis) -> None:
        await client.aclose()

    def workers(self, scenario: str, count: int) -> list[common.WorkerSpec]:
        argv = [common.tool("arq"), "peers.arq_peer.WorkerSettings"]
        if scenario == "pickup":
            return [
                common.WorkerSpec("poll_delay=0.5 (default)", argv, {"BENCH_CONCURRENCY": "1000"}),
                common.WorkerSpec(
                    "poll_delay=0.01",
                    argv,
                    {"BENCH_CONCURRENCY": "1000", "BENCH_POLL_DELAY": "0.01"},
                ),
            ]
        jobs = 1000 if scenario == "drain" else count
        label = f"max_jobs={common.shown(scenario, jobs)}"
        return [common.WorkerSpec(label, argv, {"BENCH_CONCURRENCY": str(jobs)})]
