"""API keys, tenant isolation (a BOLA sweep over every route in the OpenAPI spec), admin-only
routes, quotas answered with 429 + Retry-After, per-tenant caps, priority classes."""

from __future__ import annotations

import re
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from backburner.errors import IdempotencyConflictError
from backburner.keys import KeysFile, key_hash

from ..helpers import eventually
from .conftest import Server, assert_error, serve

KEY_A = "bb_tenant-a-key-" + "a" * 30
KEY_B = "bb_tenant-b-key-" + "b" * 30
ADMIN = "bb_admin-key-" + "c" * 30
TENANTS = (
    '{"defaults": {"max_in_flight": 50, "submissions_per_minute": 0},'
    ' "tenants": {"tiny": {"max_in_flight": 2, "max_prompt_chars": 20, "max_tokens": 8,'
    ' "max_priority": 0},'
    ' "slow": {"submissions_per_minute": 2}}}'
)
KEYED: dict[str, Any] = {
    "api_keys": f"acme:{KEY_A},globex:{key_hash(KEY_B)},tiny:bb_tiny-{'t' * 30},"
    f"slow:bb_slow-{'s' * 30}",
    "admin_keys": f"ops:{ADMIN}",
    "tenants": TENANTS,
}
TINY = f"bb_tiny-{'t' * 30}"
SLOW = f"bb_slow-{'s' * 30}"


def as_(server: Server, key: str | None) -> httpx.AsyncClient:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    transport = httpx.ASGITransport(server.app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver", headers=headers)


@asynccontextmanager
async def keyed(tmp_path: Path, **extra: Any) -> AsyncIterator[Server]:
    async with serve("asgi", tmp_path, **{**KEYED, **extra}) as server:
        yield server


async def submit(client: httpx.AsyncClient, type: str = "quick", **body: Any) -> str:
    response = await client.post("/v1/tasks", json={"type": type, "input": {}, **body})
    assert response.status_code == 202, response.text
    return str(response.json()["task_id"])


async def finished(client: httpx.AsyncClient, task_id: str, status: str) -> None:
    async def reached() -> bool:
        response = await client.get(f"/v1/tasks/{task_id}")
        return bool(response.json()["status"] == status)

    await eventually(reached, message=f"{task_id} {status}")


# -- keys -------------------------------------------------------------------------------------


async def test_a_key_is_required_and_never_reveals_a_tenant(tmp_path: Path) -> None:
    async with keyed(tmp_path) as server:
        async with as_(server, None) as anonymous:
            missing = await anonymous.get("/v1/tasks")
            assert_error(missing, 401, "unauthorized")
            assert missing.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await anonymous.get("/healthz")).status_code == 200
            assert (await anonymous.post("/v1/tasks", json={"type": "quick"})).status_code == 401
        for wrong in ["bb_nobody", KEY_A + "x", key_hash(KEY_A).split(":")[1], "acme"]:
            async with as_(server, wrong) as stranger:
                refused = await stranger.get("/v1/tasks")
                body = assert_error(refused, 401, "unauthorized")
                assert "acme" not in body["message"]
                assert body == assert_error(await stranger.get("/v1/stats"), 401)
        for key in (KEY_A, KEY_B, ADMIN):
            async with as_(server, key) as known:
                assert (await known.get("/v1/tasks")).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        "Basic YWxhZGRpbjpvcGVu",
        "Bearer",
        "Bearer ",
        f"Bearer {KEY_A} extra",
        f"Token {KEY_A}",
        "Bearer key;drop",
        f"Bearer\t{KEY_A}",
        f"Bearer {key_hash(KEY_A)}",
    ],
)
async def test_a_malformed_authorization_header_is_a_400(tmp_path: Path, header: str) -> None:
    async with keyed(tmp_path) as server, as_(server, None) as client:
        response = await client.get("/v1/tasks", headers={"Authorization": header})
        assert_error(response, 400, "invalid_authorization")


async def test_two_authorization_headers_are_a_400(tmp_path: Path) -> None:
    async with keyed(tmp_path) as server, as_(server, None) as client:
        headers = [("Authorization", f"Bearer {KEY_A}"), ("Authorization", f"Bearer {KEY_B}")]
        response = await client.get("/v1/tasks", headers=headers)
        assert_error(response, 400, "invalid_authorization")


async def test_the_scheme_is_case_insensitive(tmp_path: Path) -> None:
    async with keyed(tmp_path) as server, as_(server, None) as client:
        response = await client.get("/v1/tasks", headers={"Authorization": f"bearer {KEY_A}"})
        assert response.status_code == 200


async def test_keys_from_the_keys_file_come_and_go_while_it_runs(tmp_path: Path) -> None:
    keys = KeysFile(tmp_path / "keys.json")
    first = keys.create("acme")
    async with serve("asgi", tmp_path, keys_file=str(keys.path)) as server:
        async with as_(server, first) as client:
            assert (await client.get("/v1/usage")).json()["tenant"] == "acme"
        second = keys.create("globex", admin=True)
        async with as_(server, second) as client:

            async def accepted() -> bool:
                return (await client.get("/v1/stats")).status_code == 200

            await eventually(accepted, message="the new admin key accepted")
        (stored,) = [k for k in keys.read() if k.tenant == "acme"]
        assert keys.revoke(stored.id) is True
        async with as_(server, first) as client:

            async def refused() -> bool:
                return (await client.get("/v1/usage")).status_code == 401

            await eventually(refused, message="the revoked key refused")
    assert first not in (tmp_path / "keys.json").read_text()
    assert (tmp_path / "keys.json").stat().st_mode & 0o077 == 0


async def test_without_keys_every_caller_is_the_default_tenant(tmp_path: Path) -> None:
    async with serve("asgi", tmp_path) as server, as_(server, "anything") as client:
        usage = (await client.get("/v1/usage")).json()
        assert usage["tenant"] == "default" and usage["admin"] is True
        assert usage["max_in_flight"] is None
        task_id = await submit(client)
        assert (await client.get(f"/v1/tasks/{task_id}")).json()["tenant"] == "default"


async def test_a_keyless_server_on_loopback_answers_only_loopback_host_names(
    tmp_path: Path,
) -> None:
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 reaches the
    # server with its own name in Host, and a keyless caller is an admin.
    async with serve("live", tmp_path, run_worker=False) as server:
        client, port = server.client, server.client.base_url.port
        task_id = await submit(client)
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}"):
            refused = await client.get("/v1/tasks", headers={"Host": host})
            assert "DNS rebinding" in assert_error(refused, 403, "forbidden")["message"]
            sneaky = await client.post(
                "/v1/tasks", json={"type": "quick", "input": {}}, headers={"Host": host}
            )
            assert_error(sneaky, 403, "forbidden")
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "localhost",
            f"app.localhost:{port}",
        ):
            listed = await client.get("/v1/tasks", headers={"Host": host})
            assert [t["task_id"] for t in listed.json()["data"]] == [task_id], host
        assert (await client.get("/healthz", headers={"Host": "evil.example"})).status_code == 200
    (tmp_path / "keyed").mkdir()
    async with serve("live", tmp_path / "keyed", run_worker=False, **KEYED) as server:
        # (with keys the Host does not matter: a page cannot know or send the key)
        headers = {"Host": "evil.example", "Authorization": f"Bearer {KEY_A}"}
        assert (await server.client.get("/v1/tasks", headers=headers)).status_code == 200


# -- isolation --------------------------------------------------------------------------------


_OWNED = re.compile(r"\{(task_id|batch_id)\}")
"""The path parameters that name something a tenant owns: a task, or a batch (also a task)."""


def _owned_routes(server: Server) -> list[tuple[str, str]]:
    """Every (method, path) of the spec that names one task or batch: the sweep's subject.
    A path parameter of any other name fails here, so a new kind of id joins the sweep."""
    spec = server.app.openapi()
    found = []
    for path, operations in spec["paths"].items():
        params = re.findall(r"\{([^}]+)\}", path)
        assert set(params) <= {"task_id", "batch_id"}, f"{path}: add its id to the sweep"
        found.extend((method.upper(), path) for method in operations if params)
    # get, events, cancel, delete, webhooks, redeliver, replay; a batch: get, results, cancel
    assert len(found) >= 10, found
    assert any("{batch_id}" in path for _, path in found), found
    return found


def _normalise(body: dict[str, Any], task_id: str) -> dict[str, Any]:
    return {"error": {k: str(v).replace(task_id, "<id>") for k, v in body["error"].items()}}


async def _batch(client: httpx.AsyncClient, max_tokens: int) -> str:
    request = {"custom_id": "only", "prompt": "hi", "max_tokens": max_tokens}
    response = await client.post("/v1/batches", json={"requests": [request]})
    assert response.status_code == 202, response.text
    return str(response.json()["batch_id"])


async def test_bola_sweep_every_task_route_answers_404_to_another_tenant(tmp_path: Path) -> None:
    # A parked batch stays parked (queued) until its child ends, not re-run every few seconds.
    allow = {"webhook_allow_hosts": "127.0.0.0/8", "pipeline_poll_s": 3600.0}
    async with keyed(tmp_path, **allow) as server, as_(server, KEY_A) as a, as_(server, KEY_B) as b:
        done = await submit(a, webhook_url="http://127.0.0.1:9/hook")  # with a webhook message
        failed = await submit(a, "doomed")
        queued = await submit(a, "quick", delay_s=3600)
        running = await submit(a, "hold")
        batch_done = await _batch(a, 1)
        batch_running = await _batch(a, 4096)  # ~80 s of simulated tokens
        await finished(a, done, "completed")
        await finished(a, failed, "failed")
        await finished(a, batch_done, "completed")
        await server.wait_started(running)
        await eventually(
            lambda: _batch_status(a, batch_running, "processing"), message="a batch running"
        )
        assert len((await a.get(f"/v1/tasks/{done}/webhooks")).json()) == 1
        victims = (done, failed, queued, running, batch_done, batch_running)
        before = {t: (await a.get(f"/v1/tasks/{t}")).json() for t in victims}
        for method, path in _owned_routes(server):
            for victim in victims:
                foreign = await b.request(method, _OWNED.sub(victim, path))
                missing_id = "task_" + uuid.uuid4().hex
                missing = await b.request(method, _OWNED.sub(missing_id, path))
                where = f"{method} {path} on a {before[victim]['status']} {before[victim]['type']}"
                assert foreign.status_code == 404, (where, foreign.text)
                assert missing.status_code == 404, (where, missing.text)
                assert _normalise(foreign.json(), victim) == _normalise(
                    missing.json(), missing_id
                ), where
                assert set(foreign.headers) - {"content-length"} == set(missing.headers) - {
                    "content-length"
                }, where
        # Nothing happened to A's jobs, and A still reaches every one of them.
        for task_id, was in before.items():
            now = (await a.get(f"/v1/tasks/{task_id}")).json()
            assert (now["status"], now["attempts"]) == (was["status"], was["attempts"])
        for method, path in _owned_routes(server):
            if method == "GET":
                own_id = batch_done if "{batch_id}" in path else done
                own = await a.request(method, _OWNED.sub(own_id, path))
                assert own.status_code == 200, (path, own.text)
        await a.post(f"/v1/batches/{batch_running}/cancel")


async def _batch_status(client: httpx.AsyncClient, batch_id: str, status: str) -> bool:
    return bool((await client.get(f"/v1/batches/{batch_id}")).json()["status"] == status)


async def test_listings_show_only_the_callers_jobs(tmp_path: Path) -> None:
    async with (
        keyed(tmp_path) as server,
        as_(server, KEY_A) as a,
        as_(server, KEY_B) as b,
        as_(server, ADMIN) as admin,
    ):
        mine = {await submit(a, "doomed") for _ in range(3)}
        theirs = {await submit(b, "doomed") for _ in range(2)}
        for task_id in mine | theirs:
            await finished(admin, task_id, "failed")
        for path in ("/v1/tasks", "/v1/dlq"):
            seen_a = {j["task_id"] for j in (await a.get(path)).json()["data"]}
            seen_b = {j["task_id"] for j in (await b.get(path)).json()["data"]}
            seen_all = {j["task_id"] for j in (await admin.get(path)).json()["data"]}
            assert (seen_a, seen_b) == (mine, theirs), path
            assert seen_all == mine | theirs, path
            only_a = await admin.get(path, params={"tenant": "acme"})
            assert {j["task_id"] for j in only_a.json()["data"]} == mine
            assert_error(await b.get(path, params={"tenant": "acme"}), 403, "forbidden")
            own = await b.get(path, params={"tenant": "globex"})
            assert {j["task_id"] for j in own.json()["data"]} == theirs


async def test_every_collection_route_hides_other_tenants_ids(tmp_path: Path) -> None:
    """The other half of the sweep: every GET route without an id, from the spec."""
    async with keyed(tmp_path) as server, as_(server, KEY_A) as a, as_(server, KEY_B) as b:
        secret = await submit(a, "doomed")
        await finished(a, secret, "failed")
        spec = server.app.openapi()
        routes = [p for p, ops in spec["paths"].items() if "{" not in p and "get" in ops]
        assert {"/v1/tasks", "/v1/dlq", "/v1/usage", "/v1/stats"} <= set(routes)
        for path in routes:
            answer = await b.get(path)
            assert answer.status_code in (200, 403), (path, answer.text)
            assert secret not in answer.text, path


async def test_admin_routes_need_an_admin_key(tmp_path: Path) -> None:
    async with keyed(tmp_path) as server, as_(server, KEY_A) as a, as_(server, ADMIN) as admin:
        for path in ("/v1/stats", "/v1/webhooks/failed"):
            assert_error(await a.get(path), 403, "forbidden")
            assert (await admin.get(path)).status_code == 200
        task_id = await submit(a, "doomed")
        await finished(a, task_id, "failed")
        replayed = await admin.post(f"/v1/dlq/{task_id}/replay")
        assert replayed.status_code == 200 and replayed.json()["tenant"] == "acme"


async def test_idempotency_keys_are_per_tenant(tmp_path: Path) -> None:
    async with keyed(tmp_path) as server, as_(server, KEY_A) as a, as_(server, KEY_B) as b:
        body = {"type": "quick", "input": {}}
        first = await a.post("/v1/tasks", json=body, headers={"Idempotency-Key": "order-1"})
        other = await b.post(
            "/v1/tasks",
            json={"type": "quick", "input": {"seconds": 0.01}},
            headers={"Idempotency-Key": "order-1"},
        )
        assert (first.status_code, other.status_code) == (202, 202)
        assert first.json()["task_id"] != other.json()["task_id"]
        again = await a.post("/v1/tasks", json=body, headers={"Idempotency-Key": "order-1"})
        assert again.status_code == 200 and again.json()["task_id"] == first.json()["task_id"]


async def test_a_library_key_never_answers_with_a_tenants_job(tmp_path: Path) -> None:
    # The library's tenant (default) stores its keys as given, a tenant's as "<tenant>/<key>":
    # the library's "acme/order-1" must not be answered with acme's "order-1".
    async with keyed(tmp_path) as server, as_(server, KEY_A) as a:
        bb = server.app.state.api.bb
        body = {"type": "quick", "input": {"seconds": 0.02}}
        first = await a.post("/v1/tasks", json=body, headers={"Idempotency-Key": "order-1"})
        assert first.status_code == 202, first.text
        with pytest.raises(IdempotencyConflictError) as raised:
            await bb.submit("quick", {"seconds": 0.02}, idempotency_key="acme/order-1")
        assert raised.value.task_id == "" and first.json()["task_id"] not in str(raised.value)
        assert len((await bb.list()).jobs) == 1
        # And the other way round: acme's key finds the library's job, and is refused.
        await bb.submit("quick", {"seconds": 0.02}, idempotency_key="acme/order-2")
        taken = await a.post("/v1/tasks", json=body, headers={"Idempotency-Key": "order-2"})
        message = assert_error(taken, 409, "idempotency_conflict")["message"]
        assert message == "idempotency key 'order-2' is already used by another job"
        assert len((await bb.list()).jobs) == 2


async def test_a_tenants_conflict_names_its_key_as_given(tmp_path: Path) -> None:
    async with keyed(tmp_path) as server, as_(server, KEY_A) as a:
        first = await a.post(
            "/v1/tasks", json={"type": "quick", "input": {}}, headers={"Idempotency-Key": "o-3"}
        )
        again = await a.post(
            "/v1/tasks",
            json={"type": "quick", "input": {"seconds": 0.01}},
            headers={"Idempotency-Key": "o-3"},
        )
        message = assert_error(again, 409, "idempotency_conflict")["message"]
        task_id = first.json()["task_id"]
        assert (
            message
            == f"idempotency key 'o-3' is already used by job {task_id} with different input"
        )


async def test_a_foreign_id_takes_about_as_long_as_a_missing_one(tmp_path: Path) -> None:
    async with keyed(tmp_path) as server, as_(server, KEY_A) as a, as_(server, KEY_B) as b:
        victim = await submit(a, "quick", delay_s=3600)
        foreign: list[float] = []
        missing: list[float] = []
        for _ in range(40):  # interleaved, so drift in the machine's speed hits both
            for ids, times in ((victim, foreign), ("task_" + uuid.uuid4().hex, missing)):
                start = time.perf_counter()
                assert (await b.get(f"/v1/tasks/{ids}")).status_code == 404
                times.append(time.perf_counter() - start)
        ratio = statistics.median(foreign) / statistics.median(missing)
        assert 0.5 < ratio < 2.0, ratio


# -- quotas, rates, caps, priority classes ----------------------------------------------------


async def test_the_in_flight_quota_answers_429_with_retry_after(tmp_path: Path) -> None:
    async with keyed(tmp_path, run_worker=False) as server, as_(server, TINY) as tiny:
        await submit(tiny)
        await submit(tiny)
        refused = await tiny.post("/v1/tasks", json={"type": "quick", "input": {}})
        body = assert_error(refused, 429, "quota_exceeded")
        assert "2" in body["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        usage = (await tiny.get("/v1/usage")).json()
        assert (usage["in_flight"], usage["max_in_flight"]) == (2, 2)
        async with as_(server, KEY_A) as a:  # another tenant is not affected
            await submit(a)
        listed = (await tiny.get("/v1/tasks")).json()["data"]
        assert len(listed) == 2
        await tiny.post(f"/v1/tasks/{listed[0]['task_id']}/cancel")
        await submit(tiny)


async def test_the_submission_rate_answers_429_with_retry_after(tmp_path: Path) -> None:
    async with keyed(tmp_path, run_worker=False) as server, as_(server, SLOW) as slow:
        await submit(slow)
        await submit(slow)
        refused = await slow.post("/v1/tasks", json={"type": "quick", "input": {}})
        assert_error(refused, 429, "rate_limited")
        assert 1 <= int(refused.headers["Retry-After"]) <= 30


async def test_prompt_and_max_tokens_caps_are_per_tenant(tmp_path: Path) -> None:
    async with keyed(tmp_path, run_worker=False) as server, as_(server, TINY) as tiny:
        long = await tiny.post("/v1/generate", json={"prompt": "x" * 21})
        assert re.search(r"limit is 20\b", assert_error(long, 422)["message"])
        many = await tiny.post("/v1/generate", json={"prompt": "hi", "max_tokens": 9})
        assert "8" in assert_error(many, 422)["message"]
        ok = await tiny.post("/v1/generate", json={"prompt": "hi", "max_tokens": 8})
        assert ok.status_code == 202, ok.text
        # Via /v1/tasks too (max_tokens left out is the task's default, 256: over the cap)
        for sneaky in ({"prompt": "x" * 21}, {"prompt": "hi", "max_tokens": 9}, {"prompt": "hi"}):
            around = await tiny.post("/v1/tasks", json={"type": "generate", "input": sneaky})
            assert_error(around, 422, "invalid_input")
        async with as_(server, KEY_A) as a:
            roomy = await a.post("/v1/generate", json={"prompt": "x" * 21, "max_tokens": 9})
            assert roomy.status_code == 202


async def test_a_generate_job_through_v1_tasks_is_checked_as_v1_generate_checks_it(
    tmp_path: Path,
) -> None:
    async with keyed(tmp_path, run_worker=False) as server, as_(server, KEY_A) as a:
        for odd, says in [
            ({"prompt": "x", "model": "nonexistent"}, "no model 'nonexistent'"),
            ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "exactly one"),
            ({"prompt": "x", "max_tokens": "6000"}, "input: max_tokens must be"),
            ({"prompt": "x", "max_tokens": 6000.0}, "input: max_tokens must be"),
            ({"prompt": ["x", "x"]}, "input: prompt must be"),
            ({"prompt": "x", "temperature": 50}, "input: temperature must be"),
            ({"messages": [{"role": "wizard", "content": "a"}]}, "input: a message needs a role"),
            ({"prompt": "x", "stop": [""]}, "input: stop must be"),
            ({"prompt": "x", "model": 7}, "input: model must be"),
        ]:
            refused = await a.post("/v1/tasks", json={"type": "generate", "input": odd})
            assert says in assert_error(refused, 422, "invalid_input")["message"], odd
        # What the run takes is still taken: no role (a user's), one stop, five stops.
        for fine in (
            {"prompt": "hi"},
            {"messages": [{"content": "a"}], "stop": "abc"},
            {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"], "temperature": 0},
        ):
            taken = await a.post("/v1/tasks", json={"type": "generate", "input": fine})
            assert taken.status_code == 202, taken.text
        listed = (await a.get("/v1/tasks")).json()["data"]
        assert len(listed) == 3  # nothing of the refused ones was stored


async def test_priority_classes_by_name(tmp_path: Path) -> None:
    async with keyed(tmp_path, run_worker=False) as server, as_(server, KEY_A) as a:
        urgent = await submit(a, priority="interactive")
        bulk = await submit(a, priority="batch")
        number = await submit(a, priority=7)
        got = [(await a.get(f"/v1/tasks/{t}")).json()["priority"] for t in (urgent, bulk, number)]
        assert got == [10, -10, 7]
        unknown = await a.post("/v1/tasks", json={"type": "quick", "priority": "urgent"})
        assert "interactive" in assert_error(unknown, 422)["message"]
        usage = (await a.get("/v1/usage")).json()
        assert usage["priority_classes"] == {"interactive": 10, "default": 0, "batch": -10}
        assert usage["max_priority"] == 100


async def test_a_tenants_priority_cap_refuses_what_would_jump_the_other_tenants(
    tmp_path: Path,
) -> None:
    # Priority comes before fair share: a tenant free to ask for 100 went ahead of everyone.
    async with keyed(tmp_path, run_worker=False) as server, as_(server, TINY) as tiny:
        assert (await tiny.get("/v1/usage")).json()["max_priority"] == 0
        for route, body in [
            ("/v1/tasks", {"type": "quick", "input": {}, "priority": "interactive"}),
            ("/v1/tasks", {"type": "quick", "input": {}, "priority": 1}),
            ("/v1/generate", {"prompt": "hi", "max_tokens": 3, "priority": 100}),
            (
                "/v1/batches",
                {"requests": [{"custom_id": "a", "prompt": "hi", "max_tokens": 3}], "priority": 5},
            ),
        ]:
            refused = await tiny.post(route, json=body)
            message = assert_error(refused, 422, "invalid_input")["message"]
            assert "above the highest this tenant may ask for (0)" in message, route
        assert (await tiny.get("/v1/tasks")).json()["data"] == []  # nothing stored
        fine = await submit(tiny, priority="batch")
        assert (await tiny.get(f"/v1/tasks/{fine}")).json()["priority"] == -10
