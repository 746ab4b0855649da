"""HTTP API benchmark (run by hand, not a test): one uvicorn API process on SQLite or Redis.

    python bench/http_api.py              # all scenarios, 3 runs each
    python bench/http_api.py --runs 1 --only post,sse_latency
    BENCH_REDIS_URL=redis://127.0.0.1:6379/8 python bench/http_api.py \
        --out bench/results/http-redis.json

Scenarios (the API and one worker each run in their own process; the load comes from wrk —
Debian's package, a C load generator, so the client is not what is measured — or, for the
event streams, from httpx in this process):
  post         POST /v1/tasks over 64 connections for 8 s: requests/s, p50/p99 latency
  get          GET /v1/tasks/{id} over 64 connections for 8 s: requests/s, p50/p99 latency
  sse_latency  time from a job's completion (its finished_at) to its terminal SSE event
               reaching a connected client: p50/p99 over 200 jobs, 50 streams open at a time
  sse_hold     1,000 streams held open at once by the one API process: its RSS per stream

Prints a table (min / median over runs) and writes bench/results/http.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import report  # bench/report.py, beside this file

ROOT = Path(__file__).resolve().parents[1]
APP = "bench.httpapp:bb"
CONCURRENCY = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@contextmanager
def service(backend: str, *, worker: bool) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    env = {**os.environ, "BACKBURNER_BACKEND_URL": backend, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "backburner"]
    api = subprocess.Popen(
        [*cmd, "api", APP, "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs = [api]
    if worker:
        procs.append(
            subprocess.Popen(
                [*cmd, "worker", APP, "--concurrency", "2000", "--log-level", "warning"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the API did not start")
        time.sleep(0.05)
    try:
        yield url, api
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[max(0, int(len(ordered) * 0.99) - 1)]


def _client(url: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=CONCURRENCY + 8, max_keepalive_connections=CONCURRENCY)
    return httpx.AsyncClient(base_url=url, limits=limits, timeout=60)


def _wrk(url: str, script: str, seconds: int = 8) -> dict[str, float]:
    """Load with wrk (Debian's package): 64 connections, 2 threads; rate and p50/p99 in ms."""
    if shutil.which("wrk") is None:
        raise SystemExit("bench/http_api.py needs wrk for the load: apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        done = subprocess.run(
            ["wrk", "-t2", f"-c{CONCURRENCY}", f"-d{seconds}s", "--latency", "-s", f.name, url],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        os.unlink(f.name)
    text = done.stdout
    if "Non-2xx" in text:
        raise RuntimeError(f"errors under load:\n{text}")

    def ms(label: str) -> float:
        value = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        if value is None:
            raise RuntimeError(f"no {label} in wrk output:\n{text}")
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[value.group(2)]
        return float(value.group(1)) * scale

    rate = re.search(r"Requests/sec:\s+([\d.]+)", text)
    assert rate is not None, text
    return {"rate": float(rate.group(1)), "p50": ms("50%"), "p99": ms("99%")}


POST_SCRIPT = """
wrk.method = "POST"
wrk.body = '{"type": "nap", "input": {"seconds": 0}}'
wrk.headers["Content-Type"] = "application/json"
"""


async def scenario_post(url: str, api: subprocess.Popen[bytes]) -> dict[str, float]:
    result = _wrk(f"{url}/v1/tasks", POST_SCRIPT)
    return {
        "post_per_s": result["rate"],
        "post_p50_ms": result["p50"],
        "post_p99_ms": result["p99"],
    }


async def scenario_get(url: str, api: subprocess.Popen[bytes]) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url) as client:
        ids = [
            (await client.post("/v1/tasks", json={"type": "nap", "input": {}})).json()["task_id"]
            for _ in range(200)
        ]
    listing = ", ".join(f'"{i}"' for i in ids)
    script = f"""
ids = {{{listing}}}
request = function()
  return wrk.format("GET", "/v1/tasks/" .. ids[math.random(#ids)])
end
"""
    result = _wrk(url, script)
    return {"get_per_s": result["rate"], "get_p50_ms": result["p50"], "get_p99_ms": result["p99"]}


async def _terminal_arrival(
    client: httpx.AsyncClient, task_id: str, opened: asyncio.Event
) -> float:
    async with client.stream("GET", f"/v1/tasks/{task_id}/events") as response:
        opened.set()
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"type":"status"' in line:
                status = json.loads(line[5:])["data"]["status"]
                if status in ("completed", "failed", "cancelled"):
                    return time.time()
    raise RuntimeError("stream ended without a terminal event")


async def scenario_sse_latency(url: str, api: subprocess.Popen[bytes]) -> dict[str, float]:
    delays: list[float] = []
    async with _client(url) as client:
        for _ in range(4):  # 4 rounds of 50 streams
            jobs = [
                (
                    await client.post("/v1/tasks", json={"type": "nap", "input": {"seconds": 1.0}})
                ).json()["task_id"]
                for _ in range(50)
            ]
            opened = [asyncio.Event() for _ in jobs]
            arrivals = await asyncio.gather(
                *(_terminal_arrival(client, t, o) for t, o in zip(jobs, opened, strict=True))
            )
            for task_id, arrived in zip(jobs, arrivals, strict=True):
                finished = (await client.get(f"/v1/tasks/{task_id}")).json()["finished_at"]
                delays.append((arrived - finished) * 1000)
    p50, p99 = _percentiles(delays)
    return {"sse_completion_to_client_p50_ms": p50, "sse_completion_to_client_p99_ms": p99}


async def scenario_sse_hold(url: str, api: subprocess.Popen[bytes]) -> dict[str, float]:
    count = 1000
    limits = httpx.Limits(max_connections=count + 16, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        jobs = [
            (
                await client.post("/v1/tasks", json={"type": "nap", "input": {}, "delay_s": 3600})
            ).json()["task_id"]
            for _ in range(count)
        ]
        await asyncio.sleep(0.5)
        before = _rss_mb(api.pid)
        opened = [asyncio.Event() for _ in jobs]
        streams = [
            asyncio.create_task(_terminal_arrival(client, t, o))
            for t, o in zip(jobs, opened, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 120)
        await asyncio.sleep(1.0)  # let the server settle with every stream open
        held = _rss_mb(api.pid)
        for task_id in jobs:  # each cancel ends its stream with a terminal event
            await client.post(f"/v1/tasks/{task_id}/cancel")
        await asyncio.wait_for(asyncio.gather(*streams), 120)
    return {
        "sse_streams_held": count,
        "sse_api_rss_before_mb": before,
        "sse_api_rss_held_mb": held,
        "sse_kb_per_stream": (held - before) * 1024 / count,
    }


SCENARIOS = {
    "post": (scenario_post, False),
    "get": (scenario_get, False),
    "sse_latency": (scenario_sse_latency, True),
    "sse_hold": (scenario_sse_hold, False),
}


def run_one(name: str) -> dict[str, float]:
    scenario, needs_worker = SCENARIOS[name]
    with report.backend_url("http") as backend, service(backend, worker=needs_worker) as (url, api):
        return asyncio.run(scenario(url, api))


def run_all(names: list[str], runs: int) -> dict[str, dict[str, float]]:
    return report.collect(names, runs, run_one)


def main() -> None:
    report.main(
        (__doc__ or "").splitlines()[0],
        list(SCENARIOS),
        ROOT / "bench" / "results" / "http.json",
        run_all,
    )


if __name__ == "__main__":
    main()
