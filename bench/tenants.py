"""Cost of tenants: enqueue and drain with 1 tenant versus 1,000 (run by hand, not a test).

    python bench/tenants.py                    # SQLite, 3 runs
    BENCH_REDIS_URL=redis://127.0.0.1:6379/8 python bench/tenants.py \
        --out bench/results/tenants-redis.json

Every submission goes through the quota checks (jobs in flight and the per-minute bucket, set
high enough never to refuse), so what is measured is their cost plus the fair-share tags.
Scenarios, each run for 1 tenant and for 1,000 (jobs spread round-robin), alternating so the
machine's drift hits both alike:
  enqueue   10,000 enqueues with 64 in flight, one producer process
  drain     10,000 queued no-op jobs drained by one worker process (concurrency 100)

Prints a table (min / median over runs, and the 1,000/1 ratio of medians) and writes JSON.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import engine  # noqa: E402  (bench/engine.py: its worker child and app)
import report  # noqa: E402
from report import summarise  # noqa: E402

from backburner import Backburner  # noqa: E402

COUNT = 10_000
HIGH_LIMITS = '{"defaults": {"max_in_flight": 1000000, "submissions_per_minute": 100000000}}'


def make_app(url: str) -> Backburner:
    return engine.make_app(url, tenants=HIGH_LIMITS)


async def enqueue_all(url: str, tenants: int, *, in_flight: int = 64) -> float:
    """Enqueue COUNT no-op jobs spread over ``tenants``; the rate per second."""
    bb = make_app(url)
    await bb.connect()
    semaphore = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with semaphore:
            await bb.enqueue("noop", tenant=f"t{i % tenants}")

    start = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(COUNT)])
    rate = COUNT / (time.perf_counter() - start)
    await bb.close()
    return rate


async def scenario_enqueue(url: str, tenants: int) -> dict[str, float]:
    return {f"enqueue_{tenants}_tenants_per_s": await enqueue_all(url, tenants)}


async def scenario_drain(url: str, tenants: int) -> dict[str, float]:
    await enqueue_all(url, tenants, in_flight=500)
    proc = engine.spawn_worker(url, COUNT, 100)
    result = engine.finish_worker(proc)
    return {f"drain_{tenants}_tenants_per_s": COUNT / result["elapsed_s"]}


SCENARIOS = {"enqueue": scenario_enqueue, "drain": scenario_drain}


def run_all(names: list[str], runs: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {}
    for name in names:
        for _ in range(runs):
            for tenants in (1, 1000):
                with report.backend_url("tenants") as url:
                    for key, value in asyncio.run(SCENARIOS[name](url, tenants)).items():
                        samples.setdefault(key, []).append(value)
    results = summarise(samples)
    for name in names:
        one = results[f"{name}_1_tenants_per_s"]["median"]
        many = results[f"{name}_1000_tenants_per_s"]["median"]
        ratio = many / one
        results[f"{name}_ratio_1000_to_1"] = dict.fromkeys(("min", "median", "max"), ratio)
    return results


def main() -> None:
    report.main(
        (__doc__ or "").splitlines()[0],
        list(SCENARIOS),
        ROOT / "bench" / "results" / "tenants.json",
        run_all,
    )


if __name__ == "__main__":
    main()
