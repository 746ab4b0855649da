"""The SDK's batch calls: AsyncClient over ASGI, Client over a real uvicorn server; the two
mirror each other."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from pathlib import Path

import httpx
import pytest

from backburner.client import AsyncClient, Batch, Client
from backburner.client._errors import InvalidInputAPIError
from backburner.errors import InvalidInputError, JobNotFoundError, WaitTimeoutError

from .conftest import batch_server, prompts

BATCH_METHODS = (
    "submit_batch",
    "batch",
    "cancel_batch",
    "poll_batch",
    "wait_batch",
    "batch_results",
)


def test_both_clients_have_the_same_batch_methods() -> None:
    for name in BATCH_METHODS:
        sync = inspect.signature(getattr(Client, name))
        asynchronous = inspect.signature(getattr(AsyncClient, name))
        assert list(sync.parameters) == list(asynchronous.parameters), name


async def test_the_async_client_submits_waits_and_reads_results(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path) as server:
        transport = httpx.ASGITransport(server.app)
        async with AsyncClient(
            "http://testserver", transport=transport, poll_interval=0.05, max_poll_interval=0.2
        ) as client:
            requests = prompts(50)
            requests[3]["model"] = "broken"
            submitted = await client.submit_batch(requests, metadata={"run": 1})
            assert isinstance(submitted, Batch) and submitted.request_counts.queued == 50
            assert not submitted.is_terminal and submitted.done == 0
            snapshots = [b async for b in client.poll_batch(submitted.batch_id, timeout=60)]
            assert snapshots[-1].is_terminal and not any(s.is_terminal for s in snapshots[:-1])
            done = await client.wait_batch(submitted.batch_id, timeout=60)
            assert done.status == "completed" and done.metadata == {"run": 1}
            assert (done.request_counts.completed, done.request_counts.failed) == (49, 1)
            assert done.done == 50
            assert (await client.batch(submitted.batch_id)) == done
            rows = [row async for row in client.batch_results(submitted.batch_id)]
            assert len(rows) == 50
            assert Counter(row["status"] for row in rows) == {"completed": 49, "failed": 1}
            assert {row["custom_id"] for row in rows} == {r["custom_id"] for r in requests}
            again = await client.cancel_batch(submitted.batch_id)  # ended: nothing changes
            assert again.status == "completed"


async def test_the_async_client_raises_typed_errors(tmp_path: Path) -> None:
    settings = {"run_worker": False, "max_batch_requests": 3}
    async with batch_server("asgi", tmp_path, **settings) as server:
        transport = httpx.ASGITransport(server.app)
        async with AsyncClient("http://testserver", transport=transport) as client:
            with pytest.raises(InvalidInputError, match=r"custom_id 'bad'.*no model 'nope'"):
                await client.submit_batch([{"custom_id": "bad", "prompt": "x", "model": "nope"}])
            with pytest.raises(InvalidInputAPIError) as too_big:
                await client.submit_batch(prompts(4))
            assert (too_big.value.status, too_big.value.type) == (413, "batch_too_large")
            with pytest.raises(InvalidInputError, match="must be a mapping"):
                await client.submit_batch(["just a prompt"])  # type: ignore[list-item]
            with pytest.raises(JobNotFoundError) as missing:
                await client.batch("task_" + "0" * 32)
            assert missing.value.task_id == "task_" + "0" * 32
            with pytest.raises(JobNotFoundError):
                _ = [row async for row in client.batch_results("task_missing")]
            with pytest.raises(JobNotFoundError):
                await client.cancel_batch("task_missing")
            queued = await client.submit_batch(prompts(2), model="fast", priority="batch")
            with pytest.raises(WaitTimeoutError):
                await client.wait_batch(queued.batch_id, timeout=0.2, poll_interval=0.05)
            cancelled = await client.cancel_batch(queued.batch_id)
            assert cancelled.status == "cancelled" and cancelled.request_counts.cancelled == 2
            rows = [row async for row in client.batch_results(queued.batch_id)]
            assert {row["status"] for row in rows} == {"cancelled"}


async def test_the_sync_client_against_a_real_server(tmp_path: Path) -> None:
    async with batch_server("live", tmp_path) as server:
        url = str(server.client.base_url)

        def use() -> None:
            with Client(url, poll_interval=0.05, max_poll_interval=0.2) as client:
                submitted = client.submit_batch(
                    [
                        {"custom_id": "a", "prompt": "x", "max_tokens": 2},
                        {
                            "custom_id": "b",
                            "messages": [{"role": "user", "content": "y"}],
                            "max_tokens": 2,
                        },
                    ],
                    idempotency_key="sync-1",
                )
                repeat = client.submit_batch(
                    [
                        {"custom_id": "a", "prompt": "x", "max_tokens": 2},
                        {
                            "custom_id": "b",
                            "messages": [{"role": "user", "content": "y"}],
                            "max_tokens": 2,
                        },
                    ],
                    idempotency_key="sync-1",
                )
                assert repeat.batch_id == submitted.batch_id
                looks = list(client.poll_batch(submitted.batch_id, timeout=30))
                assert looks[-1].status == "completed"
                done = client.wait_batch(submitted.batch_id, timeout=30)
                assert done.request_counts.completed == 2
                rows = {row["custom_id"]: row for row in client.batch_results(done.batch_id)}
                assert set(rows) == {"a", "b"}
                assert rows["a"]["result"]["simulated"] is True
                with pytest.raises(JobNotFoundError):
                    client.batch("task_missing")
                with pytest.raises(InvalidInputError, match="custom_id 'a' is also"):
                    client.submit_batch([{"custom_id": "a", "prompt": "x"}] * 2)

        await asyncio.to_thread(use)
