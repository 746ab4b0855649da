"""Webhook latency: from a job's completion to its webhook at a receiver on loopback.

    python bench/webhooks.py [--runs 3] [--only steady,burst]

A worker process runs no-op jobs with a webhook_url; the receiver (tests/webhooks/receiver.py,
in this process) notes when each signed POST arrives. Latency = arrival - the job's
finished_at (both this machine's clock). ``steady``: 1,000 jobs enqueued at 200/s; ``burst``:
1,000 enqueued at once. SQLite, or Redis with BENCH_REDIS_URL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
from report import summarise  # noqa: E402

from backburner import Backburner, JobContext, Settings  # noqa: E402
from backburner.webhooks import generate_secret, verify  # noqa: E402
from tests.webhooks.receiver import receiver  # noqa: E402

COUNT = 1000


def make_app(url: str, secret: str) -> Backburner:
    settings = Settings(backend_url=url, webhook_secret=secret, webhook_allow_hosts="127.0.0.0/8")
    bb = Backburner(url, settings=settings)

    @bb.task(max_attempts=1)
    async def noop(ctx: JobContext) -> None:
        return None

    return bb


async def child_worker(url: str, secret: str) -> None:
    bb = make_app(url, secret)
    async with bb:
        worker = bb.worker(concurrency=200)
        running = asyncio.create_task(worker.run())
        await worker.started.wait()
        print(json.dumps({"ready": True}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        worker.shutdown()
        await running


async def scenario(url: str, burst: bool) -> dict[str, float]:
    secret = generate_secret()
    with receiver() as hooks:
        proc = subprocess.Popen(
            [sys.executable, __file__, "_worker", url, secret],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        if not json.loads(proc.stdout.readline()).get("ready"):
            raise RuntimeError("worker did not start")
        bb = make_app(url, secret)
        async with bb:
            hook = hooks.url("/bench")
            if burst:
                jobs = await asyncio.gather(
                    *(bb.enqueue("noop", webhook_url=hook) for _ in range(COUNT))
                )
            else:
                jobs = []
                for _ in range(COUNT):
                    jobs.append(await bb.enqueue("noop", webhook_url=hook))
                    await asyncio.sleep(1 / 200)
            arrived = await asyncio.to_thread(hooks.state.wait_for, "/bench", COUNT, 120)
            finished = {}
            for job in jobs:
                done = await bb.get(job.task_id)
                finished[job.task_id] = done.finished_at
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(60)
    latencies = []
    ids = set()
    for request in arrived:
        verify(secret, request.headers, request.body)
        task_id = json.loads(request.body)["task_id"]
        ids.add(request.headers["webhook-id"])
        latencies.append((request.at - finished[task_id]) * 1000)
    assert len(ids) == COUNT, "each job's webhook arrived exactly once"
    latencies.sort()
    name = "burst" if burst else "steady"
    return {
        f"{name}_p50_ms": latencies[len(latencies) // 2],
        f"{name}_p99_ms": latencies[int(len(latencies) * 0.99) - 1],
        f"{name}_max_ms": latencies[-1],
    }


def run_all(names: list[str], runs: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {}
    for name in names:
        for _ in range(runs):
            with report.backend_url("webhooks") as url:
                result: dict[str, Any] = asyncio.run(scenario(url, burst=name == "burst"))
            for key, value in result.items():
                samples.setdefault(key, []).append(value)
    return summarise(samples)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        asyncio.run(child_worker(sys.argv[2], sys.argv[3]))
    else:
        report.main(
            __doc__.splitlines()[0],
            ["steady", "burst"],
            ROOT / "bench" / "results" / "webhooks.json",
            run_all,
        )
