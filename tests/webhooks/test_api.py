"""The webhook routes of the HTTP API: the delivery log, redeliver, and the SSRF check at submit."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from ..live_server import live_server
from .conftest import SECRET
from .receiver import Answer, Receiver

pytestmark = pytest.mark.timeout(60)
GENERATE = {"prompt": "hi", "model": "simulated", "max_tokens": 2}


async def test_the_log_lists_attempts_and_redeliver_sends_again(
    hooks: Receiver, tmp_path: Path
) -> None:
    settings = {"webhook_secret": SECRET, "webhook_allow_hosts": "127.0.0.0/8"}
    with live_server(tmp_path, **settings) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answer = await client.post(
                "/v1/generate", json={**GENERATE, "webhook_url": hooks.url("/api")}
            )
            assert answer.status_code == 202
            task_id = answer.json()["task_id"]
            await asyncio.to_thread(hooks.state.wait_for, "/api", 1)
            deadline = time.monotonic() + 20
            while True:
                log = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()
                if log[0]["status"] == "delivered" or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.02)
            (message,) = log
            assert message["event"] == "task.completed" and message["status"] == "delivered"
            (attempt,) = message["attempts"]
            assert attempt["status_code"] == 204 and attempt["latency_ms"] > 0
            again = await client.post(f"/v1/tasks/{task_id}/webhooks/redeliver")
            assert again.status_code == 202 and again.json()["msg_id"] == message["msg_id"]
            first, second = await asyncio.to_thread(hooks.state.wait_for, "/api", 2)
            assert first.headers["webhook-id"] == second.headers["webhook-id"]
            missing = await client.get("/v1/tasks/task_nope/webhooks")
            assert missing.status_code == 404


async def test_redeliver_without_a_webhook_is_a_409(tmp_path: Path) -> None:
    with live_server(tmp_path) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            task_id = (await client.post("/v1/generate", json=GENERATE)).json()["task_id"]
            answer = await client.post(f"/v1/tasks/{task_id}/webhooks/redeliver")
            assert answer.status_code == 409
            assert answer.json()["error"]["type"] == "invalid_state"
            assert (await client.get(f"/v1/tasks/{task_id}/webhooks")).json() == []


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:10.0.0.1]/x",
        "http://2130706433/",
        "http://localhost:8080/x",
        "https://user:pw@example.com/x",
    ],
)
async def test_private_webhook_urls_are_refused_with_422(url: str, tmp_path: Path) -> None:
    with live_server(tmp_path, run_worker=False) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answer = await client.post("/v1/generate", json={**GENERATE, "webhook_url": url})
            assert answer.status_code == 422, answer.text
            assert answer.json()["error"]["type"] == "invalid_input"
            assert "webhook_url" in answer.json()["error"]["message"]
            assert (await client.get("/v1/tasks")).json()["data"] == []


async def test_failed_messages_are_listed_and_counted(hooks: Receiver, tmp_path: Path) -> None:
    hooks.state.plan("/gone", Answer(410), Answer(410))
    settings = {"webhook_secret": SECRET, "webhook_allow_hosts": "127.0.0.0/8"}
    with live_server(tmp_path, **settings) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            ids = []
            for _ in range(2):
                answer = await client.post(
                    "/v1/generate", json={**GENERATE, "webhook_url": hooks.url("/gone")}
                )
                ids.append(answer.json()["task_id"])
            await asyncio.to_thread(hooks.state.wait_for, "/gone", 2)
            deadline = time.monotonic() + 20
            while True:
                stats = (await client.get("/v1/stats")).json()
                if stats["webhooks"].get("failed") == 2 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.02)
            assert stats["webhooks"] == {"pending": 0, "delivered": 0, "failed": 2}
            first = (await client.get("/v1/webhooks/failed", params={"limit": 1})).json()
            assert len(first["data"]) == 1 and first["next_cursor"]
            rest = (
                await client.get("/v1/webhooks/failed", params={"cursor": first["next_cursor"]})
            ).json()
            assert rest["next_cursor"] is None
            listed = [m["task_id"] for m in first["data"] + rest["data"]]
            assert sorted(listed) == sorted(ids)
            assert first["data"][0]["attempts"][0]["status_code"] == 410
