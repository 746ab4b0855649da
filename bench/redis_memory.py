"""Redis's memory per job, queued and finished (run by hand, not a test).

    python bench/redis_memory.py                 # 5,000 jobs a case, the redis-server on PATH
    python bench/redis_memory.py --jobs 2000 --port 6393

Starts its own redis-server on a port of its own (6392 by default; never 6379) that keeps
nothing on disk, and for each case puts ``--jobs`` jobs with a 200-byte input through the
backend (as a producer and a worker would), then reads ``used_memory`` from ``INFO memory``
before and after: the bytes per job, every key and index entry included. The cases:
  queued               enqueued, not yet run
  completed            run once, completed with a 200-byte result, no events of its own
  completed, 3 events  the same, with 3 token events of its own (so it has its stream)
  ... node 512         the last again on a Redis with ``stream-node-max-bytes 512``
Prints a table and writes bench/results/redis-memory.json (docs/redis.md, "Memory").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

from own_redis import own_redis, server_argv  # (bench/own_redis.py, beside this file)

from backburner.backends.base import Complete, NewJob, fingerprint, new_task_id
from backburner.backends.redis import RedisBackend
from backburner.models import Job
from backburner.worker.runner import default_worker_id

ROOT = Path(__file__).resolve().parents[1]
INPUT = {"prompt": "x" * 188}  # 200 bytes as JSON
RESULT = {"text": "y" * 190}  # 200 bytes as JSON
CASES = (
    ("queued", 0, False, ()),
    ("completed", 0, True, ()),
    ("completed, 3 events", 3, True, ()),
    ("completed, 3 events, node 512", 3, True, ("--stream-node-max-bytes", "512")),
)


def _job(now: float) -> NewJob:
    return NewJob(
        task_id=new_task_id(),
        type="summarize",
        input=INPUT,
        fingerprint=fingerprint("summarize", INPUT),
        created_at=now,
        run_at=now,
    )


async def _put(port: int, jobs: int, events: int, finish: bool) -> None:
    backend = RedisBackend(f"redis://127.0.0.1:{port}/0", prefix="bench")
    await backend.connect()
    try:
        worker, now = default_worker_id(), time.time()
        for first in range(0, jobs, 200):
            count = min(200, jobs - first)
            await asyncio.gather(*(backend.enqueue(_job(now)) for _ in range(count)))
        if not finish:
            return
        held: list[Job] = []
        while len(held) < jobs:
            claimed = await backend.claim(worker, limit=100, now=now, lease_s=600)
            if not claimed:
                raise SystemExit(f"claimed {len(held)} of {jobs} jobs")
            for job in claimed:
                for n in range(events):
                    await backend.append_event(job.task_id, job.fence, "token", {"n": n}, now=now)
            await asyncio.gather(
                *(backend.finish(j.task_id, j.fence, Complete(RESULT), now=now) for j in claimed)
            )
            held += claimed
    finally:
        await backend.close()


def measure(server: str, port: int, jobs: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, events, finish, options in CASES:
        with own_redis(server_argv(server, port, *options), port) as client:
            asyncio.run(_put(port, 10, events, finish))  # scripts loaded, global keys made
            before = int(client.info("memory")["used_memory"])
            asyncio.run(_put(port, jobs, events, finish))
            after = int(client.info("memory")["used_memory"])
            version = str(client.info("server")["redis_version"])
        rows.append(
            {
                "case": name,
                "bytes_per_job": round((after - before) / jobs),
                "redis_version": version,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per case (5,000)")
    parser.add_argument("--redis-server", default="redis-server", help="the binary to run")
    parser.add_argument("--port", type=int, default=6392, help="its port (6392; never 6379)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/redis-memory.json"))
    args = parser.parse_args()
    if shutil.which(args.redis_server) is None:
        raise SystemExit(f"{args.redis_server} not found")
    rows = measure(args.redis_server, args.port, args.jobs)
    print(f"Redis {rows[0]['redis_version']}, {args.jobs:,} jobs a case: bytes per job")
    for row in rows:
        print(f"  {row['case']:32} {row['bytes_per_job']:>8,}")
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "jobs": args.jobs,
        "cases": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
