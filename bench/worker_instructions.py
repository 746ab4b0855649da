"""A worker process's instructions per job in a drain (run by hand, not a test).

    python bench/worker_instructions.py                 # 3,000 no-op jobs, concurrency 100
    python bench/worker_instructions.py --jobs 5000 --code /tmp/wt-old   # another checkout

Counts what the worker's process executes (Python, its C extensions, the event loop), not how
long it takes: the same code gives the same count within about 1% on a machine whose drain
wall time varies by half between runs, so two versions of the worker compare where timed A/B
runs do not (bench/redis_instructions.py does the same for Redis's side). Starts a plain
redis-server of its own on a port of its own (6392 by default; never 6379), runs ``backburner
worker`` under valgrind's callgrind against it, puts 300 jobs through for warm-up (imports,
scripts, caches), zeroes the counts, enqueues the jobs from this process with 200 in flight
(about 50 times as fast as the worker runs under valgrind, so it drains a full queue, claiming
through its finishes), and dumps the counts once all have completed. Needs valgrind (Debian:
``apt install valgrind``). Prints instructions per job; writes
bench/results/worker-instructions.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from own_redis import own_redis, server_argv  # (bench/own_redis.py, beside this file)
from peers.common import in_flight

from backburner import Backburner, JobContext

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 300
URL_ENV = "BENCH_WORKER_URL"


def make_app(url: str) -> Backburner:
    """The worker's app: one no-op task (``bench/worker_instructions.py:bb`` for the worker)."""
    app = Backburner(url)

    @app.task(max_attempts=1)
    async def noop(ctx: JobContext) -> None:
        return None

    return app


bb = make_app(os.environ.get(URL_ENV, "redis://127.0.0.1:6392/0"))


async def _enqueue(url: str, count: int) -> None:
    app = make_app(url)
    await app.connect()
    try:
        await in_flight(lambda: app.enqueue("noop"), count, 200)
    finally:
        await app.close()


def _wait_completed(
    client: redis.Redis, count: int, worker: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + 600
    while int(client.zcard("{bb}:i:st:completed:noop")) < count:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise SystemExit("the jobs did not complete within 10 minutes")
        time.sleep(0.1)


def measure(code: Path, python: str, port: int, jobs: int, concurrency: int) -> dict[str, object]:
    url = f"redis://127.0.0.1:{port}/0"
    directory = Path(tempfile.mkdtemp(prefix="bench-worker-callgrind-"))
    log = directory / "worker.log"
    env = {
        **os.environ,
        URL_ENV: url,
        "PYTHONPATH": os.pathsep.join((str(code), str(ROOT / "bench"))),
        "PYTHONHASHSEED": "0",
    }
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={directory}/callgrind.out.%p",
        python,
        "-m",
        "backburner",
        "worker",
        "worker_instructions:bb",
        "--backend",
        url,
        "--concurrency",
        str(concurrency),
        "--log-level",
        "warning",
    ]
    try:
        with own_redis(server_argv("redis-server", port), port) as client:
            with log.open("wb") as out:
                worker = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                asyncio.run(_enqueue(url, WARM_UP))
                _wait_completed(client, WARM_UP, worker, log)
                pid = str(worker.pid)
                subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
                asyncio.run(_enqueue(url, jobs))
                _wait_completed(client, WARM_UP + jobs, worker, log)
                subprocess.run(
                    ["callgrind_control", "-d", "drain", pid], check=True, capture_output=True
                )
            finally:
                worker.terminate()
                worker.wait(60)
        total = None
        for dump in directory.glob("callgrind.out.*"):
            text = dump.read_text(errors="replace")
            if re.search(r"^desc: Trigger: dump drain", text, re.MULTILINE):
                found = re.search(r"^summary: (\d+)", text, re.MULTILINE)
                total = int(found.group(1)) if found else None
        if total is None:
            raise SystemExit("no callgrind dump of the drain was written")
    finally:
        shutil.rmtree(directory)
    return {"code": str(code), "jobs": jobs, "concurrency": concurrency, "per_job": total // jobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs counted (3,000)")
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's (100)")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout to count")
    parser.add_argument("--python", default=sys.executable, help="the worker's interpreter")
    parser.add_argument("--port", type=int, default=6392, help="its Redis's port (never 6379)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/worker-instructions.json"))
    args = parser.parse_args()
    if args.port == 6379:
        raise SystemExit("use a port of its own: 6379 is the machine's Redis")
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (valgrind: apt install valgrind)")
    result = measure(args.code.resolve(), args.python, args.port, args.jobs, args.concurrency)
    result["date"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    print(f"{args.code}: {result['per_job']:,} worker instructions per job ({args.jobs:,} jobs)")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
