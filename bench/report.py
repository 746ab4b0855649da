"""What every benchmark here shares: its command line, min/median/max over runs, a table, JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from backburner import Hooks, Job

Results = dict[str, dict[str, float]]


@contextmanager
def backend_url(name: str = "bench") -> Iterator[str]:
    """A fresh, empty backend for one run: a SQLite file in a temporary directory, or, with
    BENCH_REDIS_URL set, a new key prefix on that Redis (its keys deleted afterwards)."""
    redis_url = os.environ.get("BENCH_REDIS_URL")
    if not redis_url:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/{name}.db"
        return
    prefix = f"{name}-{uuid.uuid4().hex[:8]}"
    try:
        yield f"{redis_url}?prefix={prefix}"
    finally:
        from backburner.backends.redis import delete_all_keys

        asyncio.run(delete_all_keys(redis_url, prefix))


class CountCompletions(Hooks):
    """A hook whose ``reached`` is set once ``target`` jobs completed in this process."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.done = 0
        self.reached = asyncio.Event()

    async def on_complete(self, job: Job) -> None:
        self.done += 1
        if self.done >= self.target:
            self.reached.set()


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM). Not getrusage's ru_maxrss: Linux carries that over an
    exec from the parent, so a child of a big parent would report the parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def summarise(samples: dict[str, list[float]]) -> Results:
    return {
        key: {"min": min(v), "median": statistics.median(v), "max": max(v), "runs": len(v)}
        for key, v in samples.items()
    }


def collect(names: Sequence[str], runs: int, run_one: Callable[[str], dict[str, float]]) -> Results:
    """Run each scenario ``runs`` times (``run_one(name)`` gives one run's figures) and
    summarise every figure over its runs."""
    samples: dict[str, list[float]] = {}
    for name in names:
        for _ in range(runs):
            for key, value in run_one(name).items():
                samples.setdefault(key, []).append(value)
    return summarise(samples)


def main(
    description: str,
    scenarios: Sequence[str],
    default_out: Path,
    run_all: Callable[[list[str], int], Results],
) -> None:
    """Parse --runs/--only/--out, run, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=",".join(scenarios))
    parser.add_argument("--out", default=str(default_out))
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(scenarios)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    results = run_all(names, args.runs)
    width = max(len(key) for key in results) + 2
    print(f"{'metric':{width}} {'min':>10} {'median':>10} {'max':>10}")
    for key, r in results.items():
        print(f"{key:{width}} {r['min']:10.2f} {r['median']:10.2f} {r['max']:10.2f}")
    meta = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"wrote {args.out}")
