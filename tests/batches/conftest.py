"""Batch tests' helpers: an app (tests/api's, with its worker) whose models are simulators —
``fast`` (the default), ``slow`` (2 tokens/s, to cancel mid-way) and ``broken`` (every call
fails for good: context length exceeded)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from ..api.conftest import Server, serve
from ..helpers import eventually

MODELS = json.dumps(
    {
        "models": {
            "fast": {
                "provider": "simulated",
                "options": {"time_to_first_token_s": 0, "tokens_per_s": 5000},
            },
            "slow": {
                "provider": "simulated",
                "options": {"time_to_first_token_s": 0, "tokens_per_s": 2},
            },
            "broken": {"provider": "simulated", "options": {"fail": "context_overflow"}},
        }
    }
)
BATCH_SETTINGS: dict[str, Any] = {
    "models": MODELS,
    "default_model": "fast",
    "pipeline_poll_s": 0.2,
    "concurrency": 300,
}
TERMINAL = {"completed", "failed", "cancelled"}


@asynccontextmanager
async def batch_server(kind: str, tmp_path: Path, **overrides: Any) -> AsyncIterator[Server]:
    """tests/api's server (a worker unless run_worker=False) with the simulated models."""
    async with serve(kind, tmp_path, **{**BATCH_SETTINGS, **overrides}) as server:
        yield server


def prompts(count: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"custom_id": f"req-{i}", "prompt": f"prompt {i}", "max_tokens": 3, **extra}
        for i in range(count)
    ]


async def submit_batch(client: httpx.AsyncClient, requests: list[Any], **body: Any) -> str:
    response = await client.post("/v1/batches", json={"requests": requests, **body})
    assert response.status_code == 202, response.text
    return str(response.json()["batch_id"])


async def wait_batch(
    client: httpx.AsyncClient, batch_id: str, statuses: set[str] = TERMINAL, timeout: float = 60
) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        response = await client.get(f"/v1/batches/{batch_id}")
        assert response.status_code == 200, response.text
        seen.update(response.json())
        return seen["status"] in statuses

    await eventually(reached, timeout=timeout, interval=0.1, message=f"{batch_id} in {statuses}")
    return seen


async def results(client: httpx.AsyncClient, batch_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/batches/{batch_id}/results")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    assert response.text == "" or response.text.endswith("\n")
    return [json.loads(line) for line in response.text.splitlines()]
