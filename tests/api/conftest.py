"""Fixtures for the HTTP API tests: one app, reached through ASGITransport or a real uvicorn.

``serve(kind, tmp_path, **settings)`` yields a ``Server`` whose ``client`` talks to a fresh app
(on a SQLite file in ``tmp_path``) with a worker and a few custom tasks whose handlers report
what they did to a thread-safe ``Probe``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from backburner import Backburner, JobContext, PermanentError, Settings
from backburner.api import create_app

from ..helpers import eventually
from ..live_server import live_server

TRANSPORTS = ["asgi", "live"]

# Fast engine timings (as live_server uses) and a short shutdown grace, so that a server
# whose worker still runs a long job stops at once at the end of a test.
FAST: dict[str, Any] = {
    "cancel_poll_s": 0.1,
    "sweep_interval_s": 0.2,
    "heartbeat_s": 0.5,
    "lease_s": 5.0,
    "retry_base_s": 0.05,
    "retry_cap_s": 0.2,
    "shutdown_grace_s": 0.1,
}

JOB_FIELDS = {
    "task_id",
    "type",
    "status",
    "priority",
    "tenant",
    "parent_id",
    "created_at",
    "started_at",
    "finished_at",
    "attempts",
    "max_attempts",
    "progress",
    "result",
    "error",
    "usage",
    "estimated_time_sec",
    "estimated_remaining_sec",
    "metadata",
    "webhook_url",
    "webhook_progress",
    "expires_at",
}
TERMINAL = {"completed", "failed", "cancelled"}


@dataclass
class Probe:
    """What the custom handlers did; written from the server's thread, read from the test."""

    started: set[str] = field(default_factory=set)
    interrupted: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, which: set[str], task_id: str) -> None:
        with self.lock:
            which.add(task_id)

    def has(self, which: set[str], task_id: str) -> bool:
        with self.lock:
            return task_id in which


def make_backburner(settings: Settings, probe: Probe) -> Backburner:
    """The app's engine with the built-in ``generate`` plus these test tasks."""
    bb = Backburner(settings=settings)

    @bb.task(max_attempts=1)
    async def hold(ctx: JobContext, seconds: float = 60.0) -> dict[str, Any]:
        """Runs until cancelled (or ``seconds``): the long job."""
        probe.add(probe.started, ctx.job_id)
        await ctx.emit("tick", {"attempt": ctx.attempt})
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            probe.add(probe.interrupted, ctx.job_id)
            raise
        probe.add(probe.finished, ctx.job_id)
        return {"held": seconds}

    @bb.task
    async def quick(ctx: JobContext, seconds: float = 0.05) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    @bb.task
    async def slow(ctx: JobContext, seconds: float = 0.5) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    @bb.task(max_attempts=1)
    async def doomed(ctx: JobContext) -> None:
        raise PermanentError("this task always fails")

    @bb.task(max_attempts=1)
    async def second_chance(ctx: JobContext) -> dict[str, Any]:
        """Fails its first attempt for good; succeeds once replayed from the DLQ."""
        if ctx.attempt == 1:
            raise PermanentError("the first attempt always fails")
        return {"attempt": ctx.attempt}

    @bb.task
    async def burst(ctx: JobContext, events: int) -> int:
        """Appends ``events`` events as fast as it can."""
        for i in range(events):
            await ctx.emit("item", {"i": i})
        return events

    @bb.task
    async def anything(ctx: JobContext, **kwargs: Any) -> None:
        return None

    return bb


@dataclass
class Server:
    kind: str
    client: httpx.AsyncClient
    app: FastAPI
    probe: Probe
    settings: Settings

    @property
    def subscriptions(self) -> int:
        """Open event streams on the server (its EventHub)."""
        return int(self.app.state.api.hub.subscriptions)

    # -- small conveniences ---------------------------------------------------------------

    async def submit(self, type: str, input: dict[str, Any] | None = None, **extra: Any) -> str:
        response = await self.client.post(
            "/v1/tasks", json={"type": type, "input": input or {}, **extra}
        )
        assert response.status_code == 202, response.text
        return str(response.json()["task_id"])

    async def job(self, task_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def wait_for(
        self, task_id: str, statuses: set[str] | str = TERMINAL, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Poll the job until its status is one of ``statuses``; return it."""
        wanted = {statuses} if isinstance(statuses, str) else statuses
        seen: dict[str, Any] = {}

        async def reached() -> bool:
            seen.update(await self.job(task_id))
            return seen["status"] in wanted

        await eventually(reached, timeout=timeout, interval=0.05, message=f"{task_id} in {wanted}")
        return seen

    async def wait_started(self, task_id: str, timeout: float = 30.0) -> None:
        """Until a ``hold`` handler runs for this job."""
        await eventually(
            lambda: self.probe.has(self.probe.started, task_id),
            timeout=timeout,
            interval=0.02,
            message=f"{task_id} started",
        )

    async def task_ids(self, **params: Any) -> list[str]:
        response = await self.client.get("/v1/tasks", params={"limit": 1000, **params})
        assert response.status_code == 200, response.text
        return [job["task_id"] for job in response.json()["data"]]


def settings_for(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(**{"backend_url": f"sqlite:///{tmp_path / 'api.db'}", **FAST, **overrides})


@asynccontextmanager
async def serve(
    kind: str, tmp_path: Path, *, run_worker: bool = True, **overrides: Any
) -> AsyncIterator[Server]:
    """A fresh app with a worker; ``kind`` is "asgi" (in this loop) or "live" (uvicorn)."""
    settings = settings_for(tmp_path, **overrides)
    probe = Probe()
    bb = make_backburner(settings, probe)
    if kind == "asgi":
        app = create_app(settings, backburner=bb, run_worker=run_worker)
        # raise_app_exceptions=False: a crash becomes the 500 a real server would answer.
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://testserver") as client,
        ):
            yield Server(kind, client, app, probe, settings)
    elif kind == "live":
        with live_server(
            tmp_path, backburner=bb, run_worker=run_worker, **{**FAST, **overrides}
        ) as live:
            app = live.server.config.app
            async with httpx.AsyncClient(base_url=live.url, timeout=30) as client:
                yield Server(kind, client, app, probe, settings)
    else:
        raise ValueError(kind)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def assert_error(
    response: httpx.Response, status: int | None, type: str | None = None
) -> dict[str, Any]:
    """The one error shape: {"error": {"type", "message"}} (and the status, if given)."""
    if status is not None:
        assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "message"}, body
    assert isinstance(body["error"]["type"], str) and body["error"]["type"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if type is not None:
        assert body["error"]["type"] == type, body
    return dict(body["error"])
