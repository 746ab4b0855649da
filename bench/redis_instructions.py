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
after a warm-up of 33 jobs through all three (scripts loaded). ``callgrind_control`` zeroes the
counts before a phase and dumps them after it. Needs valgrind (Debian: ``apt install
valgrind``). Prints instructions per job for each phase and writes
bench/results/redis-instructions.json. A Redis built with symbols (``--redis-server``) makes
the dumps readable by ``callgrind_annotate`` (kept with ``--keep``) for where they go.
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

from own_redis import own_redis, server_argv  # (bench/own_redis.py, beside this file)

from backburner.backends.base import Complete, NewJob, fingerprint, new_task_id
from backburner.backends.redis import RedisBackend
from backburner.models import Job
from backburner.worker.runner import default_worker_id

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("enqueue", "claim", "finish")
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


async def _run_phases(port: int, jobs: int) -> None:
    """The workload, with the counts zeroed before each phase and dumped after it."""
    backend = RedisBackend(f"redis://127.0.0.1:{port}/0", prefix="bench")
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
    finally:
        await backend.close()


def _dumped(directory: Path) -> dict[str, int]:
    """Instructions of each phase, from the dumps callgrind_control -d wrote."""
    counts: dict[str, int] = {}
    for dump in sorted(directory.glob("callgrind.out.*.*")):
        text = dump.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: dump (\w+)", text, re.MULTILINE)
        total = re.search(r"^summary: (\d+)", text, re.MULTILINE)
        if trigger and total and trigger.group(1) in PHASES:
            counts[trigger.group(1)] = int(total.group(1))
    return counts


def measure(server: str, port: int, jobs: int, keep: Path | None) -> dict[str, object]:
    directory = Path(tempfile.mkdtemp(prefix="bench-callgrind-"))
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={directory}/callgrind.out.%p",
        *server_argv(server, port),
    ]
    with own_redis(argv, port) as client:
        version = str(client.info("server")["redis_version"])
        asyncio.run(_run_phases(port, jobs))
    counts = _dumped(directory)
    if keep is not None:
        shutil.copytree(directory, keep, dirs_exist_ok=True)
    shutil.rmtree(directory)
    if set(counts) != set(PHASES):
        raise SystemExit(f"missing dumps: found {sorted(counts)} of {list(PHASES)}")
    return {
        "redis_version": version,
        "jobs": jobs,
        "instructions_per_job": {phase: round(counts[phase] / jobs) for phase in PHASES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=990, help="jobs per phase (990)")
    parser.add_argument("--redis-server", default="redis-server", help="the binary to count")
    parser.add_argument("--port", type=int, default=6391, help="its port (6391; never 6379)")
    parser.add_argument("--keep", type=Path, help="copy the callgrind dumps to this directory")
    parser.add_argument("--out", default=str(ROOT / "bench/results/redis-instructions.json"))
    args = parser.parse_args()
    if args.port == 6379:
        raise SystemExit("use a port of its own: 6379 is the machine's Redis")
    for tool in ("valgrind", "callgrind_control", args.redis_server):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (valgrind: apt install valgrind)")
    result = measure(args.redis_server, args.port, args.jobs, args.keep)
    result["date"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    per_job = result["instructions_per_job"]
    assert isinstance(per_job, dict)
    print(f"Redis {result['redis_version']}, {args.jobs} jobs: instructions per job")
    for phase in PHASES:
        print(f"  {phase:8} {per_job[phase]:>10,}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
