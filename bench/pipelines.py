"""Pipeline benchmark on the embedded SQLite backend, or Redis (run by hand, not a test).

    python bench/pipelines.py                 # both scenarios, 3 runs each
    python bench/pipelines.py --runs 5 --only steps
    BENCH_REDIS_URL=redis://127.0.0.1:6379/8 python bench/pipelines.py \\
        --out bench/results/pipelines-redis.json

With BENCH_REDIS_URL each run uses a fresh key prefix on that Redis and deletes its keys after.

Scenarios:
  steps    one worker in this process. A pipeline of 2,000 trivial steps against a plain task
           making the same 2,000 calls (each job's run time, started_at..finished_at): the
           cost of checkpointing a step, in µs. Then a pipeline whose first attempt stores its
           2,000 steps and asks for a retry: its second attempt's run time per step is the
           cost of replaying a stored step after a crash.
  fanout   a pipeline that maps 10,000 trivial children, run by one worker process at
           concurrency 100 (children and the parent alike): wall time from the enqueue to the
           parent's completion, and the worker's peak RSS.

Prints a table (min / median / max over runs) and writes bench/results/pipelines.json.
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

from backburner import Backburner, JobContext, Retry, Settings  # noqa: E402
from backburner.models import Job, JobStatus  # noqa: E402

STEPS = 2_000
CHILDREN = 10_000


def trivial(i: int) -> int:
    return i


def make_app(url: str) -> Backburner:
    bb = Backburner(url, settings=Settings(backend_url=url, retry_base_s=0.0))

    @bb.task(max_attempts=1)
    async def plain(ctx: JobContext, n: int) -> int:
        total = 0
        for i in range(n):
            total += trivial(i)
        return total

    @bb.task(max_attempts=1)
    async def child(ctx: JobContext, i: int) -> int:
        return i

    async def steps(ctx: Any, n: int, retry_once: bool = False) -> int:
        total = 0
        for i in range(n):
            total += await ctx.step(f"s{i}", trivial, i)
        if retry_once and ctx.attempt == 1:
            raise Retry("replay the stored steps", after=0)
        return total

    async def fan_out(ctx: Any, count: int) -> int:
        return sum(await ctx.map("children", child, list(range(count))))

    bb.pipeline(max_attempts=2)(steps)
    bb.pipeline(max_attempts=1)(fan_out)
    return bb


def run_time(job: Job, attempt: int | None = None) -> float:
    if attempt is not None:
        (record,) = [r for r in job.history if r.attempt == attempt]
        assert record.finished_at is not None
        return record.finished_at - record.started_at
    assert job.started_at is not None and job.finished_at is not None
    return job.finished_at - job.started_at


async def scenario_steps(url: str, n: int = STEPS) -> dict[str, float]:
    bb = make_app(url)
    async with bb:
        worker = bb.worker(concurrency=1)
        running = asyncio.create_task(worker.run())
        await worker.started.wait()
        try:
            plain = await bb.wait((await bb.enqueue("plain", {"n": n})).task_id, timeout=600)
            piped = await bb.wait((await bb.enqueue("steps", {"n": n})).task_id, timeout=600)
            replay = await bb.wait(
                (await bb.enqueue("steps", {"n": n, "retry_once": True})).task_id, timeout=600
            )
        finally:
            worker.shutdown()
            await running
    for job in (plain, piped, replay):
        assert job.status == JobStatus.COMPLETED, job.error
    assert replay.attempts == 2
    return {
        "step_checkpoint_us": 1e6 * (run_time(piped) - run_time(plain)) / n,
        "step_replay_us": 1e6 * (run_time(replay, 2) - run_time(plain)) / n,
        "plain_task_run_ms": 1000 * run_time(plain),
    }


# -- fan-out: one worker process -------------------------------------------------------------


async def child_worker(url: str, target: int, concurrency: int) -> None:
    """Run a worker until ``target`` jobs completed; print a JSON line with its peak RSS."""
    counter = report.CountCompletions(target)
    bb = make_app(url)
    bb.hooks.hooks.append(counter)
    await bb.connect()
    worker = bb.worker(concurrency=concurrency)
    running = asyncio.create_task(worker.run())
    await worker.started.wait()
    print(json.dumps({"ready": True}), flush=True)
    await counter.reached.wait()
    worker.shutdown()
    await running
    await bb.close()
    print(json.dumps({"peak_rss_mb": report.peak_rss_mb()}), flush=True)


async def scenario_fanout(url: str, count: int = CHILDREN) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "_worker", url, str(count + 1), "100"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line or not json.loads(line).get("ready"):
        raise RuntimeError("worker did not start")
    bb = make_app(url)
    async with bb:
        start = time.perf_counter()
        job = await bb.enqueue("fan_out", {"count": count})
        done = await bb.wait(job.task_id, timeout=1800)
        wall = time.perf_counter() - start
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result == sum(range(count))
    result: dict[str, float] = json.loads(proc.stdout.readline())
    proc.wait(60)
    return {
        "fanout_10k_wall_s": wall,
        "fanout_children_per_s": count / wall,
        "fanout_worker_peak_rss_mb": result["peak_rss_mb"],
    }


SCENARIOS = {"steps": scenario_steps, "fanout": scenario_fanout}


def run_one(name: str) -> dict[str, float]:
    with report.backend_url("pipelines") as url:
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
        ROOT / "bench" / "results" / "pipelines.json",
        run_all,
    )


if __name__ == "__main__":
    main()
