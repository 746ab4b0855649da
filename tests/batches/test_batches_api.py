"""POST /v1/batches and friends over the real app: a thousand simulated prompts end with the
right counts and one JSONL line each (SQLite and Redis), limits answered 413, a bad request
refusing the batch by its custom_id, cancel, idempotency, quotas."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from backburner import Backburner, JobContext, Settings
from backburner.api import create_app

from ..api.conftest import Server, assert_error
from ..helpers import eventually
from .conftest import batch_server, prompts, results, submit_batch, wait_batch

COUNT_FIELDS = {"total", "queued", "processing", "completed", "failed", "cancelled"}


JSON = {"content-type": "application/json"}


async def test_a_thousand_prompts_complete_with_counts_and_jsonl_results(
    tmp_path: Path, db_url: str
) -> None:
    requests = prompts(1000)
    broken = {7, 500, 999}
    for index in broken:
        requests[index]["model"] = "broken"
    requests[1] = {"custom_id": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with batch_server("asgi", tmp_path, backend_url=db_url) as server:
        client = server.client
        submitted = await client.post("/v1/batches", json={"requests": requests})
        assert submitted.status_code == 202, submitted.text
        batch = submitted.json()
        batch_id = batch["batch_id"]
        assert submitted.headers["Location"] == f"/v1/batches/{batch_id}"
        assert int(submitted.headers["Retry-After"]) >= 1
        assert batch["request_counts"] == {
            **dict.fromkeys(COUNT_FIELDS, 0),
            "total": 1000,
            "queued": 1000,
        }
        assert batch["results_url"] == f"/v1/batches/{batch_id}/results"
        done = await wait_batch(client, batch_id, timeout=120)
        assert done["status"] == "completed", done
        assert done["request_counts"] == {
            "total": 1000,
            "queued": 0,
            "processing": 0,
            "completed": 997,
            "failed": 3,
            "cancelled": 0,
        }
        assert done["started_at"] is not None and done["finished_at"] >= done["started_at"]
        assert "Retry-After" not in (await client.get(f"/v1/batches/{batch_id}")).headers
        lines = await results(client, batch_id)
        assert len(lines) == 1000
        by_id = {line["custom_id"]: line for line in lines}
        assert set(by_id) == {r["custom_id"] for r in requests}
        assert {tuple(sorted(line)) for line in lines} == {
            ("custom_id", "error", "result", "status", "task_id", "usage")
        }
        assert Counter(line["status"] for line in lines) == {"completed": 997, "failed": 3}
        for index in broken:
            line = by_id[f"req-{index}"]
            assert line["status"] == "failed" and line["result"] is None
            assert line["error"]["type"] == "context_length_exceeded"
        ok = by_id["req-2"]
        assert ok["error"] is None and ok["result"]["simulated"] is True
        assert ok["result"]["model"] == "fast" and len(ok["result"]["text"].split()) == 3
        assert ok["usage"]["output_tokens"] == 3
        assert by_id["chat"]["status"] == "completed"
        assert len({line["task_id"] for line in lines}) == 1000
        child = await server.job(ok["task_id"])  # each request is a task of its own
        assert child["type"] == "generate" and child["metadata"] == {"custom_id": "req-2"}
        assert child["input"]["prompt"] == "prompt 2"
        assert batch_id not in await server.task_ids(type="generate")


async def test_a_batch_holds_ten_thousand_requests_and_one_more_is_a_413(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        client = server.client
        big = prompts(10_000)
        accepted = await client.post("/v1/batches", json={"requests": big})
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["request_counts"]["queued"] == 10_000
        too_many = await client.post("/v1/batches", json={"requests": prompts(10_001)})
        message = assert_error(too_many, 413, "batch_too_large")["message"]
        assert "10001" in message and "10000" in message and "max_batch_requests" in message
        assert await server.task_ids() == [accepted.json()["batch_id"]]


async def test_the_limits_are_settings(tmp_path: Path) -> None:
    limits = {"max_batch_requests": 5, "max_batch_bytes": 2000, "max_body_bytes": 1000}
    async with batch_server("asgi", tmp_path, run_worker=False, **limits) as server:
        client = server.client
        assert_error(await client.post("/v1/batches", json={"requests": prompts(6)}), 413)
        assert (await client.post("/v1/batches", json={"requests": prompts(5)})).status_code == 202
        # Over max_batch_bytes, declared or streamed without a length: 413 batch_too_large.
        long = [{"custom_id": "a", "prompt": "x" * 2100}]
        declared = await client.post("/v1/batches", json={"requests": long})
        assert "max_batch_bytes" in assert_error(declared, 413, "batch_too_large")["message"]
        body = json.dumps({"requests": long}).encode()

        async def chunks() -> Any:
            for start in range(0, len(body), 500):
                yield body[start : start + 500]

        streamed = await client.post(
            "/v1/batches", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert_error(streamed, 413, "batch_too_large")
        # Batches have their own limit: a body over max_body_bytes is fine here, not elsewhere.
        roomy = [{"custom_id": "a", "prompt": "x" * 1500}]
        assert (await client.post("/v1/batches", json={"requests": roomy})).status_code == 202
        elsewhere = await client.post("/v1/generate", json={"prompt": "x" * 1500})
        assert_error(elsewhere, 413, "body_too_large")
        assert len(await server.task_ids()) == 2


GOOD = {"custom_id": "fine", "prompt": "hello", "max_tokens": 8}


@pytest.mark.parametrize(
    ("bad", "status", "type", "says"),
    [
        ({"custom_id": "m", "prompt": "hi", "model": "nope"}, 422, "invalid_input", "no model"),
        (
            {"custom_id": "m", "prompt": "hi", "messages": [{"role": "user", "content": "x"}]},
            422,
            "invalid_request",
            "exactly one of prompt or messages",
        ),
        ({"custom_id": "m"}, 422, "invalid_request", "exactly one of prompt or messages"),
        ({"custom_id": "m", "prompt": "x" * 51}, 422, "invalid_input", "limit is 50"),
        ({"custom_id": "m", "prompt": "hi", "max_tokens": 65}, 422, "invalid_input", "64"),
        ({"custom_id": "m", "prompt": "hi", "max_tokens": 0}, 422, "invalid_request", "max_tokens"),
        ({"custom_id": "m", "prompt": "hi", "temperature": 3}, 422, "invalid_request", "temperat"),
        ({"custom_id": "m", "prompt": "hi", "colour": 1}, 422, "invalid_request", "colour"),
        (
            {"custom_id": "m", "messages": [{"role": "king", "content": "x"}]},
            422,
            "invalid_request",
            "messages.0.role",
        ),
        ({"custom_id": "m", "prompt": 7}, 422, "invalid_request", "prompt"),
        ({"custom_id": "", "prompt": "hi"}, 422, "invalid_request", "custom_id"),
    ],
)
async def test_a_bad_request_refuses_the_whole_batch_naming_its_custom_id(
    tmp_path: Path, bad: dict[str, Any], status: int, type: str, says: str
) -> None:
    caps = {"max_prompt_chars": 50, "max_tokens_limit": 64}
    async with batch_server("asgi", tmp_path, run_worker=False, **caps) as server:
        requests = [GOOD, {**GOOD, "custom_id": "also fine"}, bad]
        answer = await server.client.post("/v1/batches", json={"requests": requests})
        message = assert_error(answer, status, type)["message"]
        assert message.startswith("requests[2]"), message
        if bad["custom_id"]:
            assert f"custom_id {bad['custom_id']!r}" in message, message
        assert says in message, message
        assert await server.task_ids() == []  # nothing stored


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({}, 422, "requests is required"),
        ({"requests": []}, 422, "at least one request"),
        ({"requests": {"a": 1}}, 422, "must be a list"),
        ({"requests": [GOOD, "just a prompt"]}, 422, "requests[1]: must be a JSON object"),
        ({"requests": [GOOD, {"prompt": "hi"}]}, 422, "requests[1]: custom_id: Field required"),
        ({"requests": [GOOD], "extra": 1}, 422, "extra"),
        ({"requests": [GOOD], "priority": "urgent"}, 422, "urgent"),
        ({"requests": [GOOD], "priority": 101}, 422, "priority"),
        ({"requests": [GOOD], "model": "nope"}, 422, "no model 'nope'"),
        ({"requests": [GOOD], "webhook_url": "ftp://x"}, 422, "webhook_url"),
        ({"requests": [GOOD], "webhook_url": "http://10.0.0.1/hook"}, 422, "webhook"),
        ([GOOD], 422, "JSON object"),
    ],
)
async def test_a_malformed_batch_is_refused_with_one_error(
    tmp_path: Path, body: Any, status: int, says: str
) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        answer = await server.client.post("/v1/batches", json=body)
        message = assert_error(answer, status)["message"]
        assert says in message, message
        assert await server.task_ids() == []


async def test_a_body_that_is_not_json_is_a_400(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        for content in (b"", b"{not json", b"\xff\xfe", b"[" * 100_000):
            answer = await server.client.post("/v1/batches", content=content, headers=JSON)
            assert_error(answer, 400, "invalid_json")
        deep: Any = "x"
        for _ in range(40):
            deep = {"d": deep}
        nested = await server.client.post(
            "/v1/batches", json={"requests": [GOOD], "metadata": deep}
        )
        assert "nests deeper" in assert_error(nested, 422, "invalid_input")["message"]


async def test_a_body_a_browser_could_send_to_any_site_is_refused(tmp_path: Path) -> None:
    # text/plain, a form and a typeless blob need no CORS preflight: without this, any page a
    # user of a keyless local server opened could submit batches against their models.
    body = json.dumps({"requests": [GOOD]}).encode()
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            answer = await server.client.post(
                "/v1/batches", content=body, headers={"content-type": kind}
            )
            assert "Content-Type: application/json" in assert_error(answer, 422)["message"], kind
        bare = httpx.Request("POST", "http://testserver/v1/batches", content=body)
        assert "content-type" not in bare.headers
        assert_error(await server.client.send(bare), 422, "invalid_request")
        assert await server.task_ids() == []
        for kind in (
            "application/json; charset=utf-8",
            "application/batch+json",
            "Application/JSON",
        ):
            taken = await server.client.post(
                "/v1/batches", content=body, headers={"content-type": kind}
            )
            assert taken.status_code == 202, (kind, taken.text)


async def test_a_custom_id_used_twice_is_refused(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        requests = [GOOD, {"custom_id": "other", "prompt": "x"}, {**GOOD, "prompt": "again"}]
        answer = await server.client.post("/v1/batches", json={"requests": requests})
        message = assert_error(answer, 422, "invalid_request")["message"]
        assert "requests[2]" in message and "'fine'" in message and "requests[0]" in message
        assert await server.task_ids() == []


async def test_batch_level_model_and_priority_apply_to_every_request(
    tmp_path: Path, db_url: str
) -> None:
    async with batch_server("asgi", tmp_path, backend_url=db_url) as server:
        requests = [
            {"custom_id": "own", "prompt": "a", "max_tokens": 2, "model": "fast"},
            {"custom_id": "inherits", "prompt": "b", "max_tokens": 2},
        ]
        body = {"model": "broken", "priority": "batch", "metadata": {"team": "x"}}
        batch_id = await submit_batch(server.client, requests, **body)
        done = await wait_batch(server.client, batch_id)
        assert done["status"] == "completed" and done["metadata"] == {"team": "x"}
        lines = {line["custom_id"]: line for line in await results(server.client, batch_id)}
        assert lines["own"]["status"] == "completed"
        assert lines["inherits"]["status"] == "failed"
        for line in lines.values():
            child = await server.job(line["task_id"])
            assert child["priority"] == -10 and child["tenant"] == "default"
        assert (await server.job(batch_id))["priority"] == -10


async def test_cancelling_a_running_batch(tmp_path: Path, db_url: str) -> None:
    async with batch_server("asgi", tmp_path, concurrency=4, backend_url=db_url) as server:
        client = server.client
        quick = [{"custom_id": f"q{i}", "prompt": "a", "max_tokens": 1} for i in range(3)]
        slow = [
            {"custom_id": f"s{i}", "prompt": "b", "max_tokens": 100, "model": "slow"}
            for i in range(20)
        ]
        batch_id = await submit_batch(client, quick + slow)

        async def some_done_and_some_running() -> bool:
            counts = (await client.get(f"/v1/batches/{batch_id}")).json()["request_counts"]
            return bool(counts["completed"] == 3 and counts["processing"] >= 1)

        await eventually(some_done_and_some_running, timeout=30, message="mid-way")
        running = await client.get(f"/v1/batches/{batch_id}")
        assert running.json()["status"] == "processing" and "Retry-After" in running.headers
        cancelled = await client.post(f"/v1/batches/{batch_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        done = await wait_batch(client, batch_id)

        async def settled() -> bool:
            counts = (await client.get(f"/v1/batches/{batch_id}")).json()["request_counts"]
            return bool(counts["queued"] == counts["processing"] == 0)

        await eventually(settled, timeout=10, message="every request ended")
        counts = (await client.get(f"/v1/batches/{batch_id}")).json()["request_counts"]
        assert done["status"] == "cancelled"
        assert counts == {
            "total": 23,
            "queued": 0,
            "processing": 0,
            "completed": 3,
            "failed": 0,
            "cancelled": 20,
        }
        lines = await results(client, batch_id)
        assert Counter(line["status"] for line in lines) == {"completed": 3, "cancelled": 20}
        assert {line["error"]["type"] for line in lines if line["status"] == "cancelled"} == {
            "cancelled"
        }
        again = await client.post(f"/v1/batches/{batch_id}/cancel")  # idempotent
        assert again.status_code == 200 and again.json()["status"] == "cancelled"


async def test_cancelling_a_batch_before_it_starts(tmp_path: Path, db_url: str) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False, backend_url=db_url) as server:
        client = server.client
        batch_id = await submit_batch(client, prompts(4))
        queued = (await client.get(f"/v1/batches/{batch_id}")).json()
        assert queued["status"] == "queued" and queued["started_at"] is None
        assert await results(client, batch_id) == []  # nothing finished yet
        cancelled = (await client.post(f"/v1/batches/{batch_id}/cancel")).json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["request_counts"]["cancelled"] == 4
        lines = await results(client, batch_id)
        assert sorted(line["custom_id"] for line in lines) == [f"req-{i}" for i in range(4)]
        assert {(line["status"], line["task_id"]) for line in lines} == {("cancelled", None)}


async def test_an_idempotency_key_gives_the_same_batch(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        client = server.client
        body = {"requests": prompts(3)}
        headers = {"Idempotency-Key": "nightly-2026-12-01"}
        first = await client.post("/v1/batches", json=body, headers=headers)
        again = await client.post("/v1/batches", json=body, headers=headers)
        assert (first.status_code, again.status_code) == (202, 200)
        assert first.json()["batch_id"] == again.json()["batch_id"]
        other = await client.post("/v1/batches", json={"requests": prompts(4)}, headers=headers)
        assert_error(other, 409, "idempotency_conflict")
        bad_key = await client.post("/v1/batches", json=body, headers={"Idempotency-Key": "a b"})
        assert_error(bad_key, 422, "invalid_input")
        assert len(await server.task_ids()) == 1


TINY_KEY = "bb_tiny-" + "t" * 30
TINY = '{"tenants": {"tiny": {"max_in_flight": 2, "max_prompt_chars": 20, "max_tokens": 8}}}'


@asynccontextmanager
async def as_tiny(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(server.app)
    headers = {"Authorization": f"Bearer {TINY_KEY}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://testserver", headers=headers
    ) as client:
        yield client


async def test_the_tenants_caps_apply_to_each_request(tmp_path: Path) -> None:
    keyed = {"api_keys": f"tiny:{TINY_KEY}", "tenants": TINY}
    async with (
        batch_server("asgi", tmp_path, run_worker=False, **keyed) as server,
        as_tiny(server) as tiny,
    ):
        fine = {"custom_id": "fine", "prompt": "hi", "max_tokens": 8}
        for bad, says in (
            ({"custom_id": "long", "prompt": "x" * 21}, "limit is 20"),
            ({"custom_id": "many", "prompt": "hi", "max_tokens": 9}, "limited to 8"),
        ):
            refused = await tiny.post("/v1/batches", json={"requests": [fine, bad]})
            message = assert_error(refused, 422, "invalid_input")["message"]
            assert re.search(rf"requests\[1\] \(custom_id '{bad['custom_id']}'\).*{says}", message)
        assert (await tiny.post("/v1/batches", json={"requests": [fine]})).status_code == 202
        assert (await tiny.get("/v1/usage")).json()["in_flight"] == 1
        await submit_batch(tiny, [fine])
        third = await tiny.post("/v1/batches", json={"requests": [fine]})
        assert_error(third, 429, "quota_exceeded")
        assert int(third.headers["Retry-After"]) >= 1


async def test_a_running_batch_is_one_job_of_the_tenants_quota(tmp_path: Path) -> None:
    keyed = {"api_keys": f"tiny:{TINY_KEY}", "tenants": TINY, "concurrency": 2}
    async with batch_server("asgi", tmp_path, **keyed) as server, as_tiny(server) as tiny:
        slow = [
            {"custom_id": f"s{i}", "prompt": "b", "max_tokens": 8, "model": "slow"}
            for i in range(10)
        ]
        batch_id = await submit_batch(tiny, slow)

        async def children_running() -> bool:
            counts = (await tiny.get(f"/v1/batches/{batch_id}")).json()["request_counts"]
            return bool(counts["processing"] >= 1)

        await eventually(children_running, timeout=30, message="children running")
        try:
            assert (await tiny.get("/v1/usage")).json()["in_flight"] == 1
            second = await tiny.post("/v1/generate", json={"prompt": "hi", "max_tokens": 1})
            assert second.status_code == 202, second.text
        finally:
            await tiny.post(f"/v1/batches/{batch_id}/cancel")


async def test_batch_routes_answer_404_for_what_is_not_a_batch(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        task_id = await server.submit("quick")
        for missing in (task_id, "task_" + "0" * 32, "nonsense"):
            for method, path in (
                ("GET", f"/v1/batches/{missing}"),
                ("GET", f"/v1/batches/{missing}/results"),
                ("POST", f"/v1/batches/{missing}/cancel"),
            ):
                answer = await server.client.request(method, path)
                message = assert_error(answer, 404, "not_found")["message"]
                assert message == f"no batch with id {missing!r}"
        assert (await server.job(task_id))["status"] == "queued"  # not cancelled


async def test_a_batch_cannot_be_submitted_as_a_plain_task(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        body = {"type": "batch", "input": {"requests": [{"custom_id": "a", "prompt": "x" * 10**6}]}}
        answer = await server.client.post("/v1/tasks", json=body)
        assert "/v1/batches" in assert_error(answer, 422, "invalid_input")["message"]
        assert await server.task_ids() == []


async def test_results_while_it_runs_show_the_finished_requests(
    tmp_path: Path, db_url: str
) -> None:
    async with batch_server("asgi", tmp_path, concurrency=4, backend_url=db_url) as server:
        client = server.client
        quick = [{"custom_id": f"q{i}", "prompt": "a", "max_tokens": 1} for i in range(2)]
        slow = [{"custom_id": "slow", "prompt": "b", "max_tokens": 200, "model": "slow"}]
        batch_id = await submit_batch(client, quick + slow)

        async def quick_ones_done() -> bool:
            counts = (await client.get(f"/v1/batches/{batch_id}")).json()["request_counts"]
            return bool(counts["completed"] == 2)

        await eventually(quick_ones_done, timeout=30, message="the quick requests done")
        lines = await results(client, batch_id)
        assert sorted(line["custom_id"] for line in lines) == ["q0", "q1"]
        await client.post(f"/v1/batches/{batch_id}/cancel")


async def test_the_batch_routes_are_in_the_openapi_spec(tmp_path: Path) -> None:
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        spec = server.app.openapi()
        paths = spec["paths"]
        assert {
            "/v1/batches",
            "/v1/batches/{batch_id}",
            "/v1/batches/{batch_id}/results",
            "/v1/batches/{batch_id}/cancel",
        } <= set(paths)
        create = paths["/v1/batches"]["post"]
        schema = create["requestBody"]["content"]["application/json"]["schema"]
        item = schema["properties"]["requests"]["items"]
        assert {"custom_id", "prompt", "messages", "model", "max_tokens"} <= set(item["properties"])
        assert "custom_id" in item["required"] and "$ref" not in json.dumps(schema)
        assert {"202", "413", "422", "429"} <= set(create["responses"])
        results_ok = paths["/v1/batches/{batch_id}/results"]["get"]["responses"]["200"]
        assert "application/x-ndjson" in results_ok["content"]


async def test_an_app_with_a_batch_task_of_its_own_keeps_it(tmp_path: Path) -> None:
    settings = Settings(backend_url=f"sqlite:///{tmp_path / 'own.db'}")
    bb = Backburner(settings=settings)

    @bb.task(name="batch")
    async def own_batch(ctx: JobContext, size: int) -> int:
        return size

    app = create_app(settings, backburner=bb)
    transport = httpx.ASGITransport(app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://testserver") as client,
    ):
        mine = await client.post("/v1/tasks", json={"type": "batch", "input": {"size": 3}})
        assert mine.status_code == 202, mine.text
        assert_error(await client.post("/v1/batches", json={"requests": [GOOD]}), 404)
        assert not any("batches" in path for path in app.openapi()["paths"])


async def test_an_api_process_reads_and_stores_one_batch_at_a_time(tmp_path: Path) -> None:
    # Each takes about 8 times its size at its peak: two maximal batches at once took an API
    # process to 921 MiB, past its k8s limit.
    async with batch_server("asgi", tmp_path, run_worker=False) as server:
        bb = server.app.state.api.bb
        store = bb.submit
        inside = 0
        most = 0

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal inside, most
            inside += 1
            most = max(most, inside)
            try:
                await asyncio.sleep(0.2)
                return await store(*args, **kwargs)
            finally:
                inside -= 1

        bb.submit = counted
        ids = await asyncio.gather(*(submit_batch(server.client, prompts(3)) for _ in range(3)))
    assert len(set(ids)) == 3
    assert most == 1
