"""Two API servers on one Redis: a job posted to one is seen, streamed and cancelled on the other.

Each server has its own backend instance and Redis connections, as two API processes would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from backburner.backends.redis import RedisBackend

from ..conftest import REDIS_TEST_URL, drop_redis_keys, require_redis
from ..helpers import eventually
from .conftest import Server, serve
from .test_events import check_log, parse_sse, read_all

pytestmark = pytest.mark.slow

Pair = Callable[[], AbstractAsyncContextManager[tuple[Server, Server]]]


@pytest.fixture
async def redis_url() -> AsyncIterator[str]:
    require_redis()
    prefix = "test-" + uuid.uuid4().hex[:12]
    yield f"{REDIS_TEST_URL}?prefix={prefix}"
    await drop_redis_keys(RedisBackend(REDIS_TEST_URL, prefix=prefix))


@pytest.fixture
async def servers(redis_url: str, tmp_path: Path) -> AsyncIterator[tuple[Server, Server]]:
    """``worker_side`` runs the worker; ``api_side`` only answers requests."""
    async with AsyncExitStack() as stack:
        worker_side = await stack.enter_async_context(
            serve("live", tmp_path / "a", backend_url=redis_url)
        )
        api_side = await stack.enter_async_context(
            serve("live", tmp_path / "b", run_worker=False, backend_url=redis_url)
        )
        yield worker_side, api_side


async def test_a_stream_cut_on_one_server_resumes_on_the_other(
    servers: tuple[Server, Server],
) -> None:
    worker_side, api_side = servers
    response = await api_side.client.post("/v1/generate", json={"prompt": "p", "max_tokens": 60})
    assert response.status_code == 202
    task_id = response.json()["task_id"]

    first: list[Any] = []
    async with worker_side.client.stream("GET", f"/v1/tasks/{task_id}/events") as stream:
        async for item in parse_sse(stream):
            if item.comment is None:
                first.append(item)
            if len(first) == 5:
                break
    rest = await read_all(api_side, task_id, headers={"Last-Event-ID": str(first[-1].id)})
    check_log(first + rest, task_id)
    assert first + rest == await read_all(worker_side, task_id)
    job = await api_side.job(task_id)
    assert job["status"] == "completed"
    tokens = [e.data["data"]["text"] for e in first + rest if e.event == "token"]
    assert "".join(tokens) == job["result"]["text"]


async def test_a_cancel_sent_to_one_server_stops_the_job_running_behind_the_other(
    servers: tuple[Server, Server],
) -> None:
    worker_side, api_side = servers
    task_id = await api_side.submit("hold", {"seconds": 60})
    await worker_side.wait_started(task_id)
    sent = time.monotonic()
    response = await api_side.client.post(f"/v1/tasks/{task_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    await eventually(
        lambda: worker_side.probe.has(worker_side.probe.interrupted, task_id),
        timeout=10,
        interval=0.01,
        message="the handler was interrupted",
    )
    assert time.monotonic() - sent < 1.0
    assert (await worker_side.job(task_id))["status"] == "cancelled"


async def test_jobs_listed_and_counted_the_same_on_both_servers(
    servers: tuple[Server, Server],
) -> None:
    worker_side, api_side = servers
    ids = [await api_side.submit("quick", {"seconds": 0.01}) for _ in range(5)]
    for task_id in ids:
        await worker_side.wait_for(task_id, "completed")
    assert await worker_side.task_ids(type="quick") == ids[::-1]
    assert await api_side.task_ids(type="quick", status="completed") == ids[::-1]
