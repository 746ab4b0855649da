"""Idempotency-Key: the same request twice is one job; a different one under the key is 409."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from .conftest import assert_error, serve

BODY = {"type": "quick", "input": {"seconds": 0.01}, "priority": 3}


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/tasks", BODY), ("/v1/generate", {"prompt": "once", "max_tokens": 2})],
)
async def test_same_key_and_body_is_the_same_task(
    transport: str, tmp_path: Path, path: str, body: dict[str, object]
) -> None:
    async with serve(transport, tmp_path) as srv:
        headers = {"Idempotency-Key": "order-42"}
        first = await srv.client.post(path, json=body, headers=headers)
        assert first.status_code == 202, first.text
        task_id = first.json()["task_id"]
        await srv.wait_for(task_id, "completed")  # a repeat after the job finished, too
        for _ in range(2):
            again = await srv.client.post(path, json=body, headers=headers)
            assert again.status_code == 200, again.text
            assert again.json()["task_id"] == task_id
            assert again.json()["poll_url"] == f"/v1/tasks/{task_id}"
            assert again.headers["location"] == f"/v1/tasks/{task_id}"
        assert await srv.task_ids() == [task_id]
        # Without the key, the same body is a new job.
        other = await srv.client.post(path, json=body)
        assert other.status_code == 202 and other.json()["task_id"] != task_id


async def test_same_key_with_defaults_spelled_out_is_the_same_request(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        headers = {"Idempotency-Key": "k1"}
        first = await srv.client.post("/v1/tasks", json={"type": "quick"}, headers=headers)
        assert first.status_code == 202
        spelled = {"type": "quick", "input": {}, "metadata": {}, "priority": None}
        again = await srv.client.post("/v1/tasks", json=spelled, headers=headers)
        assert again.status_code == 200, again.text
        assert again.json()["task_id"] == first.json()["task_id"]


async def test_same_key_with_another_body_is_a_conflict(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        headers = {"Idempotency-Key": "order-43"}
        first = await srv.client.post("/v1/tasks", json=BODY, headers=headers)
        assert first.status_code == 202
        task_id = first.json()["task_id"]
        changes = [
            {**BODY, "input": {"seconds": 0.02}},
            {**BODY, "priority": 4},
            {**BODY, "metadata": {"a": 1}},
            {**BODY, "type": "slow"},
        ]
        for body in changes:
            conflict = await srv.client.post("/v1/tasks", json=body, headers=headers)
            assert_error(conflict, 409, "idempotency_conflict")
            assert task_id in conflict.json()["error"]["message"]
        # The same key on the other submit route is another request, too.
        other_route = await srv.client.post("/v1/generate", json={"prompt": "x"}, headers=headers)
        assert_error(other_route, 409, "idempotency_conflict")
        assert await srv.task_ids() == [task_id]


async def test_a_hundred_concurrent_posts_with_one_key_make_one_task(tmp_path: Path) -> None:
    async with serve("live", tmp_path) as srv:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(
            base_url=str(srv.client.base_url), limits=limits, timeout=60
        ) as c:
            answers = await asyncio.gather(
                *(
                    c.post("/v1/tasks", json=BODY, headers={"Idempotency-Key": "burst"})
                    for _ in range(100)
                )
            )
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200] * 99 + [202], statuses
        ids = {a.json()["task_id"] for a in answers}
        assert len(ids) == 1
        assert await srv.task_ids() == list(ids)


INVALID_KEYS: list[tuple[str, str | bytes]] = [
    ("spaces", "has spaces"),
    ("256-chars", "x" * 256),
    ("300-chars", "x" * 300),
    ("tab", "tab\there"),
    ("empty", ""),
    ("non-ascii", "caf\u00e9".encode("latin-1")),
]


async def test_an_invalid_key_is_refused_and_nothing_is_stored(
    transport: str, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        for case_id, key in INVALID_KEYS:
            with subtests.test(case_id):
                response = await srv.client.post(
                    "/v1/tasks", json=BODY, headers={"Idempotency-Key": key}
                )
                assert 400 <= response.status_code < 500, response.text
                assert_error(response, None)
                assert await srv.task_ids() == []
        # The longest valid key works.
        longest = await srv.client.post(
            "/v1/tasks", json=BODY, headers={"Idempotency-Key": "~" * 255}
        )
        assert longest.status_code == 202


@pytest.mark.parametrize("path", ["/v1/tasks", "/v1/batches"])
async def test_two_keys_in_one_request_are_refused(tmp_path: Path, path: str) -> None:
    # Which one counted was up to the server: a proxy adding a second header would have
    # silently changed which job a retry maps to.
    body = BODY if path == "/v1/tasks" else {"requests": [{"prompt": "hi", "model": "simulated"}]}
    async with serve("asgi", tmp_path, run_worker=False) as srv:
        response = await srv.client.post(
            path, json=body, headers=[("Idempotency-Key", "k1"), ("Idempotency-Key", "k2")]
        )
        assert assert_error(response, 422, "invalid_input")["message"] == (
            "send one Idempotency-Key header, not several"
        )
        assert await srv.task_ids() == []


async def test_a_full_queue_is_429_but_an_idempotent_repeat_still_answers(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path, run_worker=False, max_queue_size=1) as srv:
        headers = {"Idempotency-Key": "first"}
        first = await srv.client.post("/v1/tasks", json=BODY, headers=headers)
        assert first.status_code == 202
        full = await srv.client.post("/v1/tasks", json=BODY)
        assert_error(full, 429, "queue_full")
        assert full.headers["retry-after"].isdigit()
        repeat = await srv.client.post("/v1/tasks", json=BODY, headers=headers)
        assert repeat.status_code == 200
        assert repeat.json()["task_id"] == first.json()["task_id"]
        assert await srv.task_ids() == [first.json()["task_id"]]
