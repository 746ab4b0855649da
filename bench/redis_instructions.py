"""Redis's instructions per job for enqueue, claim and finish (run by hand, not a test).

    python bench/redis_instructions.py                  # 990 jobs, the redis-server on PATH
    python bench/redis_instructions.py --redis-server /path/to/redis-server --jobs 2000

Counts what Redis executes, not how long it takes, so two versions of the scripts compare on a
noisy machine where wall-time A/B runs do not (docs/redis.md, "Counted instructions"). Starts
its own redis-server under valgrind's callgrind on a port of its own (6391 by default; never
6379), then, from this process through the backend (RedisBackend, as a worker would):
  enqueue  the jobs, in gathers of 200 (enqueue_many batches, as a busy producer sends them)
  claim    all of them, 25 a call
  finish   all of them (Complete), in gathers of 33: the first of each alone, the rest one
           finish_many
  handoff  one enqueue at a time into an idle worker's hand (--handoff-jobs of them, 50 by
           default): the worker registers idle (wait_for_jobs), then the counts are zeroed,
           the job enqueued and handed to it, and the counts dumped (the registration and the
           job's finish are not counted: only what the enqueue that finds a worker costs)
  single   --handoff-jobs enqueues one at a time, each awaited before the next (as a producer
           that enqueues from a request handler sends them), with no worker waiting
after a warm-up of 33 jobs through the first three and of 3 through the hand-off (scripts
loaded). ``callgrind_control`` zeroes the counts before a phase and dumps them after it.
Needs valgrind (Debian: ``apt install valgrind``). Prints instructions per job for each phase
and writes bench/results/redis-instructions.json. A Redis built with symbols
(``--redis-server``) makes the dumps readable by ``callgrind_annotate`` (kept with ``--keep``)
for where they go.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from own_redis import own_redis, server_argv  # (bench/own_redis.py, beside this file)

from backburner.backends.base import Complete, NewJob, fingerprint, new_task_id
from backburner.backends.redis import RedisBackend
from backburner.models import Job
from backburner.worker.runner import default_worker_id

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("enqueue", "claim", "finish", "handoff", "single")
WARM_UP = 33


def _job(now: float) -> NewJob:
    payload = {"x": 1}
    return NewJob(
        task_id=new_task_id(),
        type="noop",
        input=payload,
        fingerprint=fingerprint("noop", payload),
        created_at=now,
        run_at=now,
    )


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


async def _registered(client: aioredis.Redis, worker: str, waiting: asyncio.Task[Any]) -> bool:
    """Whether the worker's wait registered it as idle (False: the wait ended first, as the
    first does, before the worker's hand-off channel is subscribed)."""
    deadline = time.monotonic() + 60
    while not await client.hexists("{bench}:idlew", worker):
        if waiting.done():
            return False
        if time.monotonic() > deadline:
            raise RuntimeError("the worker never registered as idle")
        await asyncio.sleep(0.005)
    return True


async def _handed_one(
    backend: RedisBackend, client: aioredis.Redis, worker: str, count: bool
) -> None:
    """One job enqueued while the worker waits idle, handed to it; counted if count."""
    handed: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
    while True:
        waiting = asyncio.create_task(
            backend.wait_for_jobs(
                now=time.time(),
                timeout=2,
                types=["noop"],
                worker_id=worker,
                lease_s=600,
                on_handed=handed.set_result,
            )
        )
        if await _registered(client, worker, waiting):
            break
        await waiting
    if count:
        _control("-z")
    await backend.enqueue(_job(time.time()))
    job = await asyncio.wait_for(handed, 30)
    if count:
        _control("-d", "handoff")
    await waiting
    await backend.finish(job.task_id, job.fence, Complete(None), now=time.time(), claimed=job)
    await backend.stop_waiting(worker)


async def _run_phases(port: int, jobs: int, handoffs: int, functions: bool) -> None:
    """The workload, with the counts zeroed before each phase and dumped after it."""
    backend = RedisBackend(f"redis://127.0.0.1:{port}/0", prefix="bench", functions=functions)
    await backend.connect()
    try:
        worker = default_worker_id()  # a real id's length: the job hash's encoding depends on it
        now = time.time()

        async def finish_all(held: list[Job]) -> None:
            for first in range(0, len(held), 33):
                await asyncio.gather(
                    *(
                        backend.finish(j.task_id, j.fence, Complete(None), now=now, claimed=j)
                        for j in held[first : first + 33]
                    )
                )

        for _ in range(WARM_UP):
            await backend.enqueue(_job(now))
        await finish_all(await backend.claim(worker, limit=WARM_UP, now=now, lease_s=600))

        _control("-z")
        for first in range(0, jobs, 200):
            count = min(200, jobs - first)
            await asyncio.gather(*(backend.enqueue(_job(now)) for _ in range(count)))
        _control("-d", "enqueue")
        held: list[Job] = []
        while len(held) < jobs:
            claimed = await backend.claim(worker, limit=25, now=now, lease_s=600)
            if not claimed:
                raise RuntimeError(f"claimed {len(held)} of {jobs} jobs")
            held += claimed
        _control("-d", "claim")
        await finish_all(held)
        _control("-d", "finish")
        client = aioredis.Redis(port=port)  # (to see the worker's registration)
        try:
            for _ in range(3):
                await _handed_one(backend, client, worker, count=False)
            for _ in range(handoffs):
                await _handed_one(backend, client, worker, count=True)
        finally:
            await client.aclose()
        _control("-z")
        for _ in range(handoffs):
            await backend.enqueue(_job(now))
        _control("-d", "single")
    finally:
        await backend.close()


def _dumped(directory: Path) -> dict[str, int]:
    """Instructions of each phase, from the dumps callgrind_control -d wrote (summed over a
    phase's dumps: the hand-off makes one per job)."""
    counts: dict[str, int] = {}
    for dump in sorted(directory.glob("callgrind.out.*.*")):
        text = dump.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: dump (\w+)", text, re.MULTILINE)
        total = re.search(r"^summary: (\d+)", text, re.MULTILINE)
        if trigger and total and trigger.group(1) in PHASES:
            phase = trigger.group(1)
            counts[phase] = counts.get(phase, 0) + int(total.group(1))
    return counts


def measure(
    server: str, port: int, jobs: int, handoffs: int, keep: Path | None, functions: bool
) -> dict[str, object]:
    directory = Path(tempfile.mkdtemp(prefix="bench-callgrind-"))
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={directory}/callgrind.out.%p",
        # hz 1: Redis's timer (serverCron, ~100,000 instructions a tick) runs once a second,
        # not ten times: at 10 it was an eighth of a hand-off's count, by the wall time the
        # count ran, not by what the job cost.
        *server_argv(server, port, "--hz", "1"),
    ]
    with own_redis(argv, port) as client:
        version = str(client.info("server")["redis_version"])
        asyncio.run(_run_phases(port, jobs, handoffs, functions))
    counts = _dumped(directory)
    if keep is not None:
        shutil.copytree(directory, keep, dirs_exist_ok=True)
    shutil.rmtree(directory)
    if set(counts) != set(PHASES):
        raise SystemExit(f"missing dumps: found {sorted(counts)} of {list(PHASES)}")
    return {
        "redis_version": version,
        "jobs": jobs,
        "handoff_jobs": handoffs,
        "scripts": "FCALL" if functions else "EVALSHA",
        "instructions_per_job": {
            phase: round(counts[phase] / (handoffs if phase in ("handoff", "single") else jobs))
            for phase in PHASES
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=990, help="jobs per phase (990)")
    parser.add_argument(
        "--handoff-jobs", type=int, default=50, help="jobs handed off, and enqueued alone (50)"
    )
    parser.add_argument("--redis-server", default="redis-server", help="the binary to count")
    parser.add_argument("--port", type=int, default=6391, help="its port (6391; never 6379)")
    parser.add_argument("--keep", type=Path, help="copy the callgrind dumps to this directory")
    parser.add_argument("--out", default=str(ROOT / "bench/results/redis-instructions.json"))
    parser.add_argument(
        "--eval", action="store_true", help="scripts by EVALSHA, not as the library's functions"
    )
    args = parser.parse_args()
    if args.port == 6379:
        raise SystemExit("use a port of its own: 6379 is the machine's Redis")
    for tool in ("valgrind", "callgrind_control", args.redis_server):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (valgrind: apt install valgrind)")
    result = measure(
        args.redis_server, args.port, args.jobs, args.handoff_jobs, args.keep, not args.eval
    )
    result["date"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    per_job = result["instructions_per_job"]
    assert isinstance(per_job, dict)
    print(
        f"Redis {result['redis_version']}, {args.jobs} jobs"
        f" ({args.handoff_jobs} handed off, {result['scripts']}): instructions per job"
    )
    for phase in PHASES:
        print(f"  {phase:8} {per_job[phase]:>10,}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
