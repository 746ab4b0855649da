"""Batch benchmark (run by hand, not a test): 10,000 simulated prompts through the HTTP API.

    python bench/batches.py                 # SQLite, 3 runs
    BENCH_BATCH_COUNT=2000 BENCH_PROMPT_CHARS=2000 python bench/batches.py --only batch
    BENCH_REDIS_URL=redis://127.0.0.1:6379/8 python bench/batches.py \
        --out bench/results/batches-redis.json

One uvicorn API process and one worker process (concurrency 2,000), as bench/http_api.py
starts them. The batch is 10,000 requests for the built-in simulator (`"model": "simulated"`:
50 tokens/s after 50 ms, so each request takes about 0.2 s for its 8 tokens). Measured:
  submit     POST /v1/batches with the 10,000 requests: the answer's latency and body size
  wall       the batch's created_at -> finished_at (server clocks): all 10,000 requests ended,
             and requests/s over that time; polled with GET /v1/batches/{id} as its
             Retry-After says (5 s for 10,000), whose latency (it counts every request) is
             also reported
  results    GET /v1/batches/{id}/results: time to read all 10,000 JSON lines, and their size
  memory     the worker's and the API's peak RSS (VmHWM)
and, for comparison (scenario ``separate``), the same prompts as 10,000 POST /v1/generate
with 64 in flight: the time to submit them, and until GET /v1/stats counts them completed.

Prints a table (min / median / max over runs) and writes bench/results/batches.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import httpx
import report  # bench/report.py, beside this file
from http_api import service  # bench/http_api.py: the API and worker processes

ROOT = Path(__file__).resolve().parents[1]
COUNT = int(os.environ.get("BENCH_BATCH_COUNT", "10000"))
_PAD_CHARS = int(os.environ.get("BENCH_PROMPT_CHARS", "0"))
PAD = " " + "x" * _PAD_CHARS if _PAD_CHARS else ""
"""BENCH_PROMPT_CHARS: characters added to each prompt (a batch whose record is large)."""
MAX_TOKENS = 8


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def _worker_pid() -> int:
    """The worker process that ``service`` started beside the API (a child of this one)."""
    found = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "-f", "backburner worker"],
        capture_output=True,
        text=True,
        check=False,
    )
    pids = [int(p) for p in found.stdout.split()]
    if len(pids) != 1:
        raise RuntimeError(f"expected one worker process, found {pids}")
    return pids[0]


async def scenario_batch(url: str, api: subprocess.Popen[bytes]) -> dict[str, float]:
    requests = [
        {
            "custom_id": f"req-{i}",
            "prompt": f"Summarise document {i}{PAD}",
            "max_tokens": MAX_TOKENS,
        }
        for i in range(COUNT)
    ]
    body = json.dumps({"requests": requests, "model": "simulated"}).encode()
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        start = time.perf_counter()
        answer = await client.post(
            "/v1/batches", content=body, headers={"Content-Type": "application/json"}
        )
        submit_ms = (time.perf_counter() - start) * 1000
        if answer.status_code != 202:
            raise RuntimeError(f"POST /v1/batches: {answer.status_code} {answer.text[:300]}")
        batch_id = answer.json()["batch_id"]
        hint = answer.headers["Retry-After"]
        polls: list[float] = []
        while True:
            await asyncio.sleep(float(hint))
            start = time.perf_counter()
            look = await client.get(f"/v1/batches/{batch_id}")
            hint = look.headers.get("Retry-After", "1")
            polls.append((time.perf_counter() - start) * 1000)
            batch = look.json()
            if batch["status"] in ("completed", "failed", "cancelled"):
                break
        counts = batch["request_counts"]
        if batch["status"] != "completed" or counts["completed"] != COUNT:
            raise RuntimeError(f"the batch ended {batch['status']}: {counts}")
        wall = batch["finished_at"] - batch["created_at"]
        start = time.perf_counter()
        lines = 0
        size = 0
        async with client.stream("GET", f"/v1/batches/{batch_id}/results") as streamed:
            async for line in streamed.aiter_lines():
                if line:
                    lines += 1
                    size += len(line) + 1
        results_s = time.perf_counter() - start
        if lines != COUNT:
            raise RuntimeError(f"{lines} result lines, not {COUNT}")
    return {
        "submit_ms": submit_ms,
        "submit_body_mb": len(body) / 1e6,
        "wall_s": wall,
        "requests_per_s": COUNT / wall,
        "poll_get_median_ms": statistics.median(polls),
        "poll_get_max_ms": max(polls),
        "results_read_s": results_s,
        "results_mb": size / 1e6,
        "api_peak_rss_mb": _peak_mb(api.pid),
        "worker_peak_rss_mb": _peak_mb(_worker_pid()),
    }


async def scenario_separate(url: str, api: subprocess.Popen[bytes]) -> dict[str, float]:
    """The same 10,000 prompts as 10,000 POST /v1/generate (64 in flight), for comparison."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        gate = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            body = {"prompt": f"Summarise document {i}", "max_tokens": MAX_TOKENS}
            headers = {"Idempotency-Key": f"bench-{i}"}  # a repeat after a dropped connection
            async with gate:
                for _ in range(5):
                    try:
                        answer = await client.post(
                            "/v1/generate", json={**body, "model": "simulated"}, headers=headers
                        )
                        break
                    except httpx.TransportError:
                        continue
                if answer.status_code not in (200, 202):
                    raise RuntimeError(f"POST /v1/generate: {answer.status_code} {answer.text}")

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(COUNT)))
        submitted = time.perf_counter() - start
        while True:
            stats = (await client.get("/v1/stats")).json()
            if stats["counts"].get("completed", 0) >= COUNT:
                break
            await asyncio.sleep(0.2)
        wall = time.perf_counter() - start
    return {
        "separate_submit_s": submitted,
        "separate_wall_s": wall,
        "separate_requests_per_s": COUNT / wall,
    }


SCENARIOS = {"batch": scenario_batch, "separate": scenario_separate}


def run_one(name: str) -> dict[str, float]:
    with report.backend_url("batches") as backend, service(backend, worker=True) as (url, api):
        return asyncio.run(SCENARIOS[name](url, api))


def run_all(names: list[str], runs: int) -> dict[str, dict[str, float]]:
    return report.collect(names, runs, run_one)


def main() -> None:
    report.main(
        (__doc__ or "").splitlines()[0],
        list(SCENARIOS),
        ROOT / "bench" / "results" / "batches.json",
        run_all,
    )


if __name__ == "__main__":
    main()
