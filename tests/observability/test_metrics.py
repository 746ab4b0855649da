"""Prometheus metrics: exact counts after known jobs, the API's /metrics, a worker's own port."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backburner import Backburner, PermanentError, Retry
from backburner.api import create_app
from backburner.errors import BackendError
from backburner.models import Job, JobStatus
from backburner.observability.metrics import Metrics
from backburner.observability.ops_server import OpsServer

from ..helpers import WORKER_TEST_SETTINGS, eventually, running_worker
from ..live_server import live_server
from ..webhooks.receiver import free_port

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_counts_after_completed_retried_failed_and_cancelled_jobs(tmp_path: Path) -> None:
    settings = WORKER_TEST_SETTINGS.replace(backend_url=f"sqlite:///{tmp_path / 'm.db'}")
    bb = Backburner(settings=settings)
    flaked: list[str] = []

    @bb.task(max_attempts=3)
    async def ok(ctx: Any) -> str:
        ctx.add_usage(input_tokens=3, output_tokens=5, model="m1", cost_usd=0.25)
        return "fine"

    @bb.task(max_attempts=3)
    async def flaky(ctx: Any) -> str:
        if not flaked:
            flaked.append(ctx.job_id)
            raise Retry("once more", after=0)
        return "fine"

    @bb.task(max_attempts=3)
    async def broken(ctx: Any) -> None:
        raise PermanentError("no")

    async with bb:
        later = await bb.enqueue("ok", delay=3600)
        await bb.cancel(later.task_id)
        async with running_worker(bb):
            jobs = [await bb.enqueue(t) for t in ("ok", "flaky", "broken")]
            for job in jobs:
                await bb.wait(job.task_id, timeout=30)
        await bb.metrics.refresh(bb.backend, now=bb.clock.now())
        found = samples(bb.metrics.render().decode())
    assert value(found, "backburner_tasks_submitted_total", type="ok") == 2
    assert value(found, "backburner_tasks_submitted_total", type="flaky") == 1
    assert value(found, "backburner_tasks_started_total", type="flaky") == 2
    assert value(found, "backburner_tasks_completed_total", type="ok", model="m1") == 1
    assert value(found, "backburner_tasks_completed_total", type="flaky", model="") == 1
    assert value(found, "backburner_task_retries_total", type="flaky", error_type="retry") == 1
    failed = value(
        found, "backburner_tasks_failed_total", type="broken", error_type="PermanentError"
    )
    assert failed == 1
    assert value(found, "backburner_tasks_cancelled_total", type="ok") == 1
    assert value(found, "backburner_llm_input_tokens_total", model="m1") == 3
    assert value(found, "backburner_llm_output_tokens_total", model="m1") == 5
    assert value(found, "backburner_llm_cost_usd_total", model="m1") == 0.25
    completed = value(
        found, "backburner_task_duration_seconds_count", type="ok", model="m1", outcome="completed"
    )
    assert completed == 1
    assert value(found, "backburner_task_queue_latency_seconds_count", type="flaky") == 2
    assert value(found, "backburner_dead_letter_jobs") == 1
    assert value(found, "backburner_jobs", status="completed") == 2
    assert value(found, "backburner_jobs", status="cancelled") == 1
    assert value(found, "backburner_jobs_in_flight") == 0
    assert value(found, "backburner_jobs_due") == 0
    assert value(found, "backburner_queue_depth", priority="0") == 0  # a series, not "no data"


async def test_the_api_serves_metrics_with_token_counts_of_generations(tmp_path: Path) -> None:
    with live_server(tmp_path) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answer = await client.post(
                "/v1/generate", json={"prompt": "hi", "model": "simulated", "max_tokens": 4}
            )
            task_id = answer.json()["task_id"]

            async def done() -> bool:
                job = (await client.get(f"/v1/tasks/{task_id}")).json()
                return bool(job["status"] == "completed")

            await eventually(done, message="the generation completed")
            response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    found = samples(response.text)
    assert value(found, "backburner_tasks_submitted_total", type="generate") == 1
    completed = value(found, "backburner_tasks_completed_total", type="generate", model="simulated")
    assert completed == 1
    assert value(found, "backburner_llm_output_tokens_total", model="simulated") == 4
    assert value(found, "backburner_llm_time_to_first_token_seconds_count", model="simulated") == 1
    assert value(found, "backburner_active_workers") == 1


@pytest.mark.timeout(60)
def test_a_worker_serves_its_own_metrics_port(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "BACKBURNER_BACKEND_URL": f"sqlite:///{tmp_path / 'w.db'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "backburner", "worker", "--metrics-port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                if "backburner_active_workers 1.0" in text:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "no metrics served"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(20)
    assert "# TYPE backburner_task_duration_seconds histogram" in text
    assert 'backburner_jobs{status="queued"} 0.0' in text


def test_the_worker_port_says_when_its_event_loop_is_stuck() -> None:
    port = free_port()
    ops = OpsServer(
        "127.0.0.1", port, render=lambda: b"m 1\n", content_type="text/plain", stall_s=0.3
    )
    ops.start()
    try:
        base = f"http://127.0.0.1:{port}"
        ops.tick()
        assert httpx.get(f"{base}/healthz", timeout=5).json() == {"status": "ok"}
        assert httpx.get(f"{base}/metrics", timeout=5).text == "m 1\n"
        missing = httpx.get(f"{base}/nope", timeout=5)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
        deadline = time.monotonic() + 20
        while (stuck := httpx.get(f"{base}/healthz", timeout=5)).status_code == 200:
            assert time.monotonic() < deadline, "never reported stalled"
            time.sleep(0.05)  # (no tick: the loop stands still)
        assert stuck.status_code == 503
        assert stuck.json()["error"]["type"] == "event_loop_stalled"
        ops.tick()
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    finally:
        ops.stop()


async def test_the_api_serves_its_own_counters_while_the_backend_is_down(tmp_path: Path) -> None:
    bb = Backburner(f"sqlite:///{tmp_path / 'm.db'}", settings=WORKER_TEST_SETTINGS)
    app = create_app(bb.settings, backburner=bb, run_worker=False)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as client,
    ):
        assert (
            await client.post("/v1/tasks", json={"type": "generate", "input": {"prompt": "hi"}})
        ).status_code == 202
        up = samples((await client.get("/metrics")).text)
        assert value(up, "backburner_backend_up") == 1
        assert value(up, "backburner_gauges_refreshed_timestamp_seconds") > 0

        async def broken(*, now: float, worker_window_s: float = 60.0) -> Any:
            raise BackendError("the disk is gone")

        bb.backend.stats = broken  # type: ignore[method-assign]
        answer = await client.get("/metrics")
    assert answer.status_code == 200
    down = samples(answer.text)
    assert value(down, "backburner_backend_up") == 0
    assert value(down, "backburner_tasks_submitted_total", type="generate") == 1
    assert value(down, "backburner_jobs", status="queued") == 1  # (stale: the last figure)


async def test_a_pipeline_that_waits_for_its_children_is_one_attempt(tmp_path: Path) -> None:
    settings = WORKER_TEST_SETTINGS.replace(
        backend_url=f"sqlite:///{tmp_path / 'p.db'}", pipeline_poll_s=30.0
    )
    bb = Backburner(settings=settings)
    go_on = asyncio.Event()

    @bb.task
    async def slow_child(ctx: Any, n: int) -> int:
        await go_on.wait()
        return n

    @bb.pipeline
    async def parent(ctx: Any) -> list[int]:
        return list(await ctx.map("children", slow_child, [1, 2]))

    async with bb:
        async with running_worker(bb, concurrency=4):
            job = await bb.enqueue("parent")

            async def parked() -> bool:
                return len((await bb.get(job.task_id)).history) >= 1 and (
                    (await bb.get(job.task_id)).status == JobStatus.QUEUED
                )

            await eventually(parked, message="the parent parked for its children")
            waited = time.monotonic()
            await asyncio.sleep(0.3)  # (a wait of known length for the parent to span)
            go_on.set()
            done = await bb.wait(job.task_id, timeout=30)
            waited = time.monotonic() - waited
        found = samples(bb.metrics.render().decode())
    assert done.status == JobStatus.COMPLETED and done.attempts == 1 and len(done.history) >= 2
    assert value(found, "backburner_tasks_started_total", type="parent") == 1
    assert value(found, "backburner_tasks_started_total", type="slow_child") == 2
    total = value(
        found, "backburner_task_duration_seconds_sum", type="parent", model="", outcome="completed"
    )
    assert total >= 0.3 and total <= waited + 5  # its first run to its end, waits included


async def test_queue_latency_runs_to_the_start_in_the_worker() -> None:
    # A job handed to an idle worker (Redis) is written claimed by its enqueue, started_at its
    # creation: its latency read 0 whatever the worker's delay in taking it up.
    metrics = Metrics()
    hook = metrics.hook(lambda: 103.25)
    handed = Job(
        task_id="task_x",
        type="summarize",
        status=JobStatus.PROCESSING,
        created_at=100.0,
        run_at=100.0,
        started_at=100.0,
        attempts=1,
    )
    await hook.on_start(handed)
    found = samples(metrics.render().decode())
    assert value(found, "backburner_task_queue_latency_seconds_sum", type="summarize") == 3.25
