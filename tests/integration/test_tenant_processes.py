"""Tenants across real processes, on SQLite and Redis: the quota holds when 50 clients submit
through two ``backburner api`` processes at once; a small tenant's jobs start early behind a
big tenant's backlog; ``serve`` refuses to listen beyond loopback without keys."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backburner import Backburner, JobContext, Settings

from ..helpers import ROOT, WorkerProcesses, eventually, free_port, running_worker

KEY = "bb_quota-test-" + "q" * 30


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path)
    try:
        yield procs
    finally:
        procs.stop()


async def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient() as client:

        async def up() -> bool:
            assert proc.poll() is None, f"the API process exited with {proc.returncode}"
            try:
                return (await client.get(f"{url}/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(up, timeout=60, interval=0.1, message=f"{url} healthy")


async def test_fifty_clients_through_two_api_processes_never_exceed_the_quota(
    db_url: str, processes: WorkerProcesses
) -> None:
    env = {"BACKBURNER_BACKEND_URL": db_url, "BACKBURNER_API_KEYS": f"acme:{KEY}"}
    urls = []
    for _ in range(2):
        port = free_port()
        proc = processes.start("--port", str(port), command="api", env=env)
        urls.append(f"http://127.0.0.1:{port}")
        await wait_healthy(urls[-1], proc)
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(headers=headers, timeout=60, limits=limits) as client:
        start = asyncio.Event()

        async def one(i: int) -> httpx.Response:
            await start.wait()
            return await client.post(f"{urls[i % 2]}/v1/generate", json={"prompt": f"#{i}"})

        calls = [asyncio.create_task(one(i)) for i in range(50)]
        start.set()
        answers = await asyncio.gather(*calls)
        statuses = sorted(a.status_code for a in answers)
        assert statuses.count(202) == 5, statuses  # the default quota: 5 in flight
        refused = [a for a in answers if a.status_code == 429]
        assert len(refused) == 45
        for answer in refused:
            assert answer.json()["error"]["type"] == "quota_exceeded"
            assert int(answer.headers["Retry-After"]) >= 1
        usage = (await client.get(f"{urls[1]}/v1/usage")).json()
        assert (usage["in_flight"], usage["max_in_flight"]) == (5, 5)
        listed = (await client.get(f"{urls[0]}/v1/tasks", params={"limit": 100})).json()
        assert len(listed["data"]) == 5
        assert {j["tenant"] for j in listed["data"]} == {"acme"}


async def test_a_small_tenant_starts_within_the_first_picks_behind_a_big_backlog(
    db_url: str,
) -> None:
    unlimited = '{"defaults": {"max_in_flight": 0, "submissions_per_minute": 0}}'
    bb = Backburner(db_url, settings=Settings(backend_url=db_url, tenants=unlimited))
    started: list[str] = []
    tenant_of: dict[str, str] = {}

    @bb.task
    async def job(ctx: JobContext) -> None:
        started.append(tenant_of[ctx.job_id])

    async with bb:
        for _ in range(1000):
            tenant_of[(await bb.enqueue("job", tenant="big")).task_id] = "big"
        for _ in range(10):
            tenant_of[(await bb.enqueue("job", tenant="small")).task_id] = "small"
        async with running_worker(bb, concurrency=1):
            await eventually(lambda: len(started) >= 25, timeout=60, message="25 picks")
        first = started[:25]
        assert first.count("small") == 10, first


def _serve(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> list[str]:
    return [sys.executable, "-m", "backburner", "serve", "--backend", "memory://", *args]


async def test_serve_refuses_a_public_address_without_keys(tmp_path: Path) -> None:
    port = str(free_port())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    refused = subprocess.run(
        _serve("--host", "0.0.0.0", "--port", port),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert refused.returncode == 2, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "without API keys" in lines[0], refused.stderr
    assert "Traceback" not in refused.stderr
    api = subprocess.run(
        [sys.executable, "-m", "backburner", "api", "--host", "0.0.0.0", "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert api.returncode == 2 and "without API keys" in api.stderr


@pytest.mark.parametrize(
    ("args", "extra_env", "warning"),
    [
        (["--host", "127.0.0.1"], {}, "no API keys"),
        (["--host", "0.0.0.0", "--insecure"], {}, "no API keys"),
        (["--host", "127.0.0.1", "--log-format", "json"], {}, '"level": "warning"'),
        (["--host", "0.0.0.0"], {"BACKBURNER_API_KEYS": f"acme:{KEY}"}, None),
    ],
)
async def test_serve_starts_on_loopback_with_insecure_or_with_keys(
    tmp_path: Path, args: list[str], extra_env: dict[str, str], warning: str | None
) -> None:
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            _serve(*args, "--port", str(port)),
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **extra_env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        text = log_path.read_text()
        if warning is None:
            assert "no API keys" not in text
            async with httpx.AsyncClient() as client:
                answer = await client.get(f"http://127.0.0.1:{port}/v1/tasks")
                assert answer.status_code == 401
        else:
            assert warning in text, text
            for line in text.splitlines():  # a log line, JSON under --log-format json
                if "no API keys" in line and "--log-format" in " ".join(args):
                    assert json.loads(line)["level"] == "warning", line
    finally:
        proc.kill()
        proc.wait(15)
