"""Job-engine benchmark on the embedded SQLite backend, or Redis (run by hand, not a test).

    python bench/engine.py                 # all scenarios, 3 runs each
    python bench/engine.py --runs 5 --only drain,pickup
    BENCH_REDIS_URL=redis://127.0.0.1:6379/8 python bench/engine.py --out bench/results/redis.json

With BENCH_REDIS_URL each run uses a fresh key prefix on that Redis and deletes its keys after.

Scenarios (each worker runs in its own process, like production):
  enqueue   one producer: 10,000 enqueues one after another, and 10,000 with 64 in flight
  drain     10,000 queued no-op jobs drained by one worker process (concurrency 100)
  pickup    an idle worker process; one job at a time, 200 times: from just before the enqueue
            call to the handler's start (the time it returns). Not started_at - created_at: a
            job handed to an idle worker is claimed by its own enqueue, at its created_at
  sleepers  10,000 jobs that each sleep 2 s, one worker process at concurrency 10,000:
            wall time from the worker's start to the last completion, and the worker's peak RSS

Prints a table (min / median over runs) and writes bench/results/engine.json.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import report  # noqa: E402  (bench/report.py, beside this file)

from backburner import Backburner, JobContext, Settings  # noqa: E402


def make_app(url: str, **settings: Any) -> Backburner:
    bb = Backburner(url, settings=Settings(backend_url=url, **settings))

    @bb.task(max_attempts=1)
    async def noop(ctx: JobContext) -> None:
        return None

    @bb.task(max_attempts=1)
    async def nap(ctx: JobContext, seconds: float) -> None:
        await asyncio.sleep(seconds)

    @bb.task(max_attempts=1)
    async def stamp(ctx: JobContext) -> float:
        return time.time()  # when the handler ran

    return bb


# -- children: one worker process per scenario ------------------------------------------------


async def child_worker(url: str, target: int, concurrency: int) -> None:
    """Run a worker until ``target`` jobs completed (0: until killed); print a JSON line."""
    counter = report.CountCompletions(target)
    bb = make_app(url)
    bb.hooks.hooks.append(counter)
    await bb.connect()
    worker = bb.worker(concurrency=concurrency)
    running = asyncio.create_task(worker.run())
    await worker.started.wait()
    start = time.perf_counter()
    print(json.dumps({"ready": True}), flush=True)
    if target == 0:
        await running
        return
    await counter.reached.wait()
    elapsed = time.perf_counter() - start
    worker.shutdown()
    await running
    await bb.close()
    rss_mb = report.peak_rss_mb()
    print(json.dumps({"elapsed_s": elapsed, "peak_rss_mb": rss_mb}), flush=True)


def spawn_worker(url: str, target: int, concurrency: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "_worker", url, str(target), str(concurrency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line or not json.loads(line).get("ready"):
        raise RuntimeError("worker did not start")
    return proc


def finish_worker(proc: subprocess.Popen[str]) -> dict[str, float]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.wait(60)
    result: dict[str, float] = json.loads(line)
    return result


# -- scenarios ----------------------------------------------------------------------------------


async def fill(url: str, task: str, payload: dict[str, Any], count: int) -> None:
    bb = make_app(url)
    await bb.connect()
    for start in range(0, count, 500):
        await asyncio.gather(*[bb.enqueue(task, payload) for _ in range(min(500, count - start))])
    await bb.close()


async def scenario_enqueue(url: str, count: int = 10_000) -> dict[str, float]:
    bb = make_app(url)
    await bb.connect()
    start = time.perf_counter()
    for _ in range(count):
        await bb.enqueue("noop")
    sequential = count / (time.perf_counter() - start)
    semaphore = asyncio.Semaphore(64)

    async def one() -> None:
        async with semaphore:
            await bb.enqueue("noop")

    start = time.perf_counter()
    await asyncio.gather(*[one() for _ in range(count)])
    concurrent = count / (time.perf_counter() - start)
    await bb.close()
    return {"enqueue_sequential_per_s": sequential, "enqueue_64_in_flight_per_s": concurrent}


async def scenario_drain(url: str, count: int = 10_000) -> dict[str, float]:
    await fill(url, "noop", {}, count)
    proc = spawn_worker(url, count, 100)
    result = finish_worker(proc)
    return {"drain_per_s": count / result["elapsed_s"], "drain_peak_rss_mb": result["peak_rss_mb"]}


async def scenario_pickup(url: str, count: int = 200) -> dict[str, float]:
    proc = spawn_worker(url, 0, 100)
    bb = make_app(url)
    await bb.connect()
    latencies: list[float] = []
    try:
        for _ in range(count):
            before = time.time()
            job = await bb.enqueue("stamp")
            done = await bb.wait(job.task_id, timeout=30)
            latencies.append((done.result - before) * 1000)
            await asyncio.sleep(0.02)  # let the worker go idle again
    finally:
        proc.terminate()
        proc.wait(30)
        await bb.close()
    latencies.sort()
    return {
        "pickup_p50_ms": latencies[len(latencies) // 2],
        "pickup_p99_ms": latencies[int(len(latencies) * 0.99) - 1],
    }


async def scenario_sleepers(url: str, count: int = 10_000) -> dict[str, float]:
    await fill(url, "nap", {"seconds": 2.0}, count)
    proc = spawn_worker(url, count, count)
    result = finish_worker(proc)
    return {"sleepers_wall_s": result["elapsed_s"], "sleepers_peak_rss_mb": result["peak_rss_mb"]}


SCENARIOS = {
    "enqueue": scenario_enqueue,
    "drain": scenario_drain,
    "pickup": scenario_pickup,
    "sleepers": scenario_sleepers,
}


def run_one(name: str) -> dict[str, float]:
    with report.backend_url() as url:
        return asyncio.run(SCENARIOS[name](url))


def run_all(names: list[str], runs: int) -> dict[str, dict[str, float]]:
    return report.collect(names, runs, run_one)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        asyncio.run(child_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return
    report.main(
        (__doc__ or "").splitlines()[0],
        list(SCENARIOS),
        ROOT / "bench" / "results" / "engine.json",
        run_all,
    )


if __name__ == "__main__":
    main()
