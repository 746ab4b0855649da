"""Bad requests: each gets its documented 4xx in the one error shape, and nothing is stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backburner.errors import BackendError

from .conftest import Server, assert_error, serve

TASKS = "/v1/tasks"
GENERATE = "/v1/generate"

# Small limits, so that the cases below are cheap to send.
LIMITS: dict[str, Any] = {
    "max_prompt_chars": 100,
    "max_tokens_limit": 1000,
    "max_body_bytes": 200_000,
    "max_json_depth": 32,
}


def nested(levels: int, leaf: Any = 1) -> Any:
    """A value whose objects nest ``levels`` deep (a scalar is depth 0).

    ``max_json_depth`` applies to the value of ``input`` (and of ``metadata``) itself.
    """
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def raw(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


# (id, path, body: bytes sent verbatim or a value sent as JSON, status, error type or None)
CASES: list[tuple[str, str, Any, int, str | None]] = [
    ("invalid-json", TASKS, raw('{"type": "quick",'), 400, "invalid_json"),
    ("invalid-json-generate", GENERATE, raw('{"prompt": "x"'), 400, "invalid_json"),
    ("empty-body", TASKS, raw(""), 400, "invalid_json"),  # no body is no JSON (as for batches)
    ("json-array", TASKS, raw('[{"type": "quick"}]'), 422, "invalid_request"),
    ("json-array-generate", GENERATE, raw('[{"prompt": "x"}]'), 422, "invalid_request"),
    ("json-string", TASKS, raw('"quick"'), 422, "invalid_request"),
    ("json-null", TASKS, raw("null"), 422, "invalid_request"),
    ("type-not-a-string", TASKS, {"type": 5}, 422, "invalid_request"),
    ("type-empty", TASKS, {"type": ""}, 422, "invalid_request"),
    ("input-not-an-object", TASKS, {"type": "quick", "input": [1]}, 422, "invalid_request"),
    ("priority-unknown-class", TASKS, {"type": "quick", "priority": "high"}, 422, "invalid_input"),
    ("priority-not-a-name", TASKS, {"type": "quick", "priority": "a b"}, 422, "invalid_request"),
    ("priority-a-fraction", TASKS, {"type": "quick", "priority": 1.5}, 422, "invalid_request"),
    ("max-attempts-zero", TASKS, {"type": "quick", "max_attempts": 0}, 422, "invalid_request"),
    ("timeout-negative", TASKS, {"type": "quick", "timeout_s": -1}, 422, "invalid_request"),
    ("delay-a-string", TASKS, {"type": "quick", "delay_s": "soon"}, 422, "invalid_request"),
    ("metadata-a-list", TASKS, {"type": "quick", "metadata": [1]}, 422, "invalid_request"),
    ("prompt-a-number", GENERATE, {"prompt": 5}, 422, "invalid_request"),
    ("max-tokens-a-string", GENERATE, {"prompt": "x", "max_tokens": "ten"}, 422, None),
    ("max-tokens-zero", GENERATE, {"prompt": "x", "max_tokens": 0}, 422, "invalid_request"),
    ("temperature-above-2", GENERATE, {"prompt": "x", "temperature": 3}, 422, "invalid_request"),
    ("neither-prompt-nor-messages", GENERATE, {}, 422, "invalid_request"),
    (
        "prompt-and-messages",
        GENERATE,
        {"prompt": "x", "messages": [{"role": "user", "content": "y"}]},
        422,
        "invalid_request",
    ),
    ("no-messages", GENERATE, {"messages": []}, 422, "invalid_request"),
    (
        "unknown-role",
        GENERATE,
        {"messages": [{"role": "wizard", "content": "y"}]},
        422,
        "invalid_request",
    ),
    # Wrong JSON types are refused, not converted (lax pydantic took "3" as 3, true as 1).
    ("priority-true", TASKS, {"type": "quick", "priority": True}, 422, "invalid_request"),
    ("priority-a-numeric-string", TASKS, {"type": "quick", "priority": "5"}, 422, None),
    ("attempts-a-string", TASKS, {"type": "quick", "max_attempts": "3"}, 422, "invalid_request"),
    ("attempts-a-float", TASKS, {"type": "quick", "max_attempts": 2.0}, 422, "invalid_request"),
    ("progress-a-string", TASKS, {"type": "quick", "webhook_progress": "false"}, 422, None),
    ("ttl-a-string", TASKS, {"type": "quick", "ttl_s": "60"}, 422, "invalid_request"),
    ("temperature-a-string", GENERATE, {"prompt": "x", "temperature": "1"}, 422, None),
    ("unknown-field", TASKS, {"type": "quick", "colour": "red"}, 422, "invalid_request"),
    ("unknown-field-generate", GENERATE, {"prompt": "x", "stream": True}, 422, "invalid_request"),
    (
        "unknown-field-in-a-message",
        GENERATE,
        {"messages": [{"role": "user", "content": "y", "name": "n"}]},
        422,
        "invalid_request",
    ),
    ("unknown-task-type", TASKS, {"type": "no_such_task"}, 422, "unknown_task"),
    ("input-does-not-fit-the-task", TASKS, {"type": "quick", "input": {"x": 1}}, 422, None),
    ("priority-101", TASKS, {"type": "quick", "priority": 101}, 422, "invalid_request"),
    ("priority-minus-101", TASKS, {"type": "quick", "priority": -101}, 422, "invalid_request"),
    ("priority-101-generate", GENERATE, {"prompt": "x", "priority": 101}, 422, None),
    ("prompt-too-long", GENERATE, {"prompt": "x" * 101}, 422, "invalid_input"),
    ("unknown-model", GENERATE, {"prompt": "x", "model": "gpt-9"}, 422, "invalid_input"),
    ("empty-stop", GENERATE, {"prompt": "x", "stop": [""]}, 422, None),
    ("five-stops", GENERATE, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 422, None),
    (
        "messages-too-long",
        GENERATE,
        {"messages": [{"role": "user", "content": "x" * 51}] * 2},  # 102 characters
        422,
        "invalid_input",
    ),
    ("max-tokens-over-the-limit", GENERATE, {"prompt": "x", "max_tokens": 1001}, 422, None),
    ("webhook-not-http", TASKS, {"type": "quick", "webhook_url": "ftp://h/x"}, 422, None),
    ("nan-in-input", TASKS, raw('{"type": "anything", "input": {"x": NaN}}'), 422, None),
    ("nan-in-metadata", GENERATE, raw('{"prompt": "x", "metadata": {"x": NaN}}'), 422, None),
    ("infinite-timeout", TASKS, raw('{"type": "quick", "timeout_s": Infinity}'), 422, None),
    ("not-utf-8", TASKS, b'{"type": "qu\xffick"}', 400, "invalid_body"),
    ("empty-body-generate", GENERATE, b"", 400, "invalid_json"),
    # A lone surrogate: Python reads the escape, but no reader of a stored job could.
    (
        "lone-surrogate-in-input",
        TASKS,
        raw(r'{"type": "anything", "input": {"s": "\ud800"}}'),
        422,
        "invalid_input",
    ),
    (
        "lone-surrogate-as-a-key",
        TASKS,
        raw(r'{"type": "anything", "input": {"\udfff": 1}}'),
        422,
        "invalid_input",
    ),
    (
        "lone-surrogate-in-metadata",
        TASKS,
        raw(r'{"type": "quick", "metadata": {"m": "x\udc00"}}'),
        422,
        "invalid_input",
    ),
    ("lone-surrogate-in-a-prompt", GENERATE, raw(r'{"prompt": "hi \udfff"}'), 422, "invalid_input"),
    ("latin-1-prompt", GENERATE, '{"prompt": "caf\u00e9"}'.encode("latin-1"), 400, None),
    ("depth-33-input", TASKS, {"type": "anything", "input": nested(33)}, 422, "invalid_input"),
    ("depth-50-input", TASKS, {"type": "anything", "input": nested(50)}, 422, "invalid_input"),
    ("depth-50-metadata", TASKS, {"type": "quick", "metadata": nested(50)}, 422, "invalid_input"),
    ("depth-50-generate", GENERATE, {"prompt": "x", "metadata": nested(50)}, 422, None),
    ("depth-900-input", TASKS, {"type": "anything", "input": nested(900)}, 422, None),
    ("depth-100000-brackets", TASKS, raw("[" * 100_000), None, None),
    ("depth-50000-closed", TASKS, raw("[" * 50_000 + "]" * 50_000), None, None),
    (
        "depth-5000-in-input",
        TASKS,
        raw('{"type": "anything", "input": {"a": ' + "[" * 5000 + "]" * 5000 + "}}"),
        None,
        None,
    ),
]


async def stored(srv: Server) -> list[str]:
    return await srv.task_ids()


async def test_bad_submissions_are_refused_and_nothing_is_stored(
    transport: str, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    """One server for all the cases (a subtest each): the task list must stay empty."""
    async with serve(transport, tmp_path, run_worker=False, **LIMITS) as srv:
        for case_id, path, body, status, error_type in CASES:
            with subtests.test(case_id):
                if isinstance(body, bytes):
                    headers = {"content-type": "application/json"}
                    response = await srv.client.post(path, content=body, headers=headers)
                else:
                    response = await srv.client.post(path, json=body)
                if status is None:
                    assert 400 <= response.status_code < 500, (response.status_code, response.text)
                assert_error(response, status, error_type)
                assert await stored(srv) == []


async def test_the_limits_themselves_are_accepted(transport: str, tmp_path: Path) -> None:
    """The boundary of every limit above is fine: the refusals are not too eager."""
    async with serve(transport, tmp_path, run_worker=False, **LIMITS) as srv:
        accepted = [
            (TASKS, {"type": "anything", "input": nested(32), "metadata": nested(32)}),
            (TASKS, {"type": "quick", "priority": 100, "ttl_s": 60, "max_attempts": 2}),
            (TASKS, {"type": "quick", "priority": -100}),
            (GENERATE, {"prompt": "x" * 100, "max_tokens": 1000}),
            (GENERATE, {"messages": [{"role": "user", "content": "x" * 40}], "temperature": 2}),
            (TASKS, {"type": "anything", "input": {"s": "\U0001f600"}}),  # a surrogate pair in JSON
        ]
        for path, body in accepted:
            response = await srv.client.post(path, json=body)
            assert response.status_code == 202, (body, response.text)
        assert len(await stored(srv)) == len(accepted)


async def chunks(total: int, size: int = 1000) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        piece = min(size, total - sent)
        sent += piece
        yield b" " * piece


def padded_body(size: int) -> bytes:
    """A valid submission padded with whitespace to exactly ``size`` bytes."""
    body = json.dumps({"type": "quick"}).encode()
    return body + b" " * (size - len(body))


async def test_a_body_over_the_limit_with_its_content_length_is_413(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path, run_worker=False, max_body_bytes=4096) as srv:
        headers = {"content-type": "application/json"}
        too_big = await srv.client.post(TASKS, content=padded_body(4097), headers=headers)
        assert_error(too_big, 413, "body_too_large")
        assert await stored(srv) == []
        just_fits = await srv.client.post(TASKS, content=padded_body(4096), headers=headers)
        assert just_fits.status_code == 202, just_fits.text


async def test_a_chunked_body_over_the_limit_is_413(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path, run_worker=False, max_body_bytes=4096) as srv:
        headers = {"content-type": "application/json"}
        response = await srv.client.post(TASKS, content=chunks(10_000), headers=headers)
        assert "content-length" not in response.request.headers
        assert response.request.headers["transfer-encoding"] == "chunked"
        assert_error(response, 413, "body_too_large")
        assert await stored(srv) == []

        async def fitting() -> AsyncIterator[bytes]:
            yield padded_body(4096)

        ok = await srv.client.post(TASKS, content=fitting(), headers=headers)
        assert ok.status_code == 202, ok.text


async def test_a_body_longer_than_its_content_length_claims_is_413(tmp_path: Path) -> None:
    """Only an ASGI client can lie so (a real HTTP/1.1 server frames the body by the header)."""
    async with serve("asgi", tmp_path, run_worker=False, max_body_bytes=4096) as srv:
        headers = {"content-type": "application/json", "content-length": "10"}
        response = await srv.client.post(TASKS, content=padded_body(10_000), headers=headers)
        assert response.request.headers["content-length"] == "10"
        assert_error(response, 413, "body_too_large")
        assert await stored(srv) == []


async def test_a_content_length_that_is_not_a_number_is_4xx(
    transport: str, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        for declared in (b"abc", b"-1", b"+5", b"0x10"):
            with subtests.test(declared.decode()):
                status = await post_with_content_length(srv, declared, b'{"type": "quick"}')
                assert 400 <= status < 500
                assert await stored(srv) == []


async def post_with_content_length(srv: Server, declared: bytes, body: bytes) -> int:
    """POST /v1/tasks with this Content-Length header verbatim; the status answered."""
    if srv.kind == "asgi":
        headers = {"content-type": "application/json", "content-length": declared.decode()}
        response = await srv.client.post(TASKS, content=body, headers=headers)
        assert_error(response, 400, "invalid_body")
        return response.status_code
    # httpx will not send such a header: write the request by hand. uvicorn (h11) refuses
    # it itself with a plain-text 400, which is fine.
    url = httpx.URL(str(srv.client.base_url))
    assert url.host and url.port
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(
            b"POST /v1/tasks HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + declared + b"\r\nConnection: close\r\n\r\n" + body
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
        await writer.wait_closed()
    version, status = answer.split(b"\r\n", 1)[0].split()[:2]
    assert version == b"HTTP/1.1", answer
    return int(status)


UNKNOWN = "task_" + "0" * 32


UNKNOWN_ID_ROUTES = [
    ("get", "GET", f"/v1/tasks/{UNKNOWN}"),
    ("events", "GET", f"/v1/tasks/{UNKNOWN}/events"),
    ("cancel", "POST", f"/v1/tasks/{UNKNOWN}/cancel"),
    ("delete", "DELETE", f"/v1/tasks/{UNKNOWN}"),
    ("replay", "POST", f"/v1/dlq/{UNKNOWN}/replay"),
    ("malformed-id", "GET", "/v1/tasks/not-even-an-id"),
]


async def test_an_unknown_task_id_is_404_on_every_route(
    transport: str, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        for case_id, method, path in UNKNOWN_ID_ROUTES:
            with subtests.test(case_id):
                assert_error(await srv.client.request(method, path), 404, "not_found")
                assert await stored(srv) == []


async def finished_job(srv: Server) -> str:
    task_id = await srv.submit("quick", {"seconds": 0.01})
    await srv.wait_for(task_id, "completed")
    return task_id


async def test_last_event_id_that_is_not_a_number_is_422(
    transport: str, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    async with serve(transport, tmp_path) as srv:
        task_id = await finished_job(srv)
        url = f"/v1/tasks/{task_id}/events"
        for value in ["abc", "-1", "1.5", "1e3", "0x1"]:
            with subtests.test(value):
                response = await srv.client.get(url, headers={"Last-Event-ID": value})
                assert_error(response, 422, "invalid_input")
                bad_after = await srv.client.get(url, params={"after": value})
                assert_error(bad_after, 422, "invalid_request")
        # An empty Last-Event-ID (some clients send one before any event) means the start.
        replay = await srv.client.get(url, headers={"Last-Event-ID": ""})
        assert replay.status_code == 200 and "id: 1\n" in replay.text
        assert_error(await srv.client.get(url, params={"after": ""}), 422, "invalid_request")


async def test_last_event_id_with_a_superscript_digit_is_422(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path) as srv:
        task_id = await finished_job(srv)
        response = await srv.client.get(
            f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": b"\xb2"}
        )
        assert_error(response, 422, "invalid_input")


async def test_a_resume_position_too_large_to_store_is_422(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path) as srv:
        task_id = await finished_job(srv)
        url = f"/v1/tasks/{task_id}/events"
        for kwargs in ({"headers": {"Last-Event-ID": "9" * 30}}, {"params": {"after": 10**30}}):
            try:
                async with srv.client.stream("GET", url, **kwargs) as response:
                    status = response.status_code
                    await response.aread()
            except httpx.TransportError as exc:
                pytest.fail(f"the server dropped the connection: {exc!r}")
            assert 400 <= status < 500, status


async def test_a_cursor_too_large_to_store_is_422(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        for path in ("/v1/tasks", "/v1/dlq"):
            response = await srv.client.get(path, params={"cursor": "1" * 30})
            assert_error(response, 422, "invalid_request")  # the schema states the pattern


async def test_a_query_parameter_given_twice_is_refused(tmp_path: Path) -> None:
    async with serve("asgi", tmp_path, run_worker=False) as server:
        answer = await server.client.get("/v1/tasks", params=[("limit", "5"), ("limit", "7")])
        body = assert_error(answer, 422, "invalid_request")
        assert "'limit'" in body["message"]
        assert (await server.client.get("/v1/tasks", params={"limit": "5"})).status_code == 200


async def test_a_503_names_no_backend_detail_and_says_a_write_may_have_taken_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve("asgi", tmp_path, run_worker=False) as server:
        backend = server.app.state.api.bb.backend
        secret = "Redis at 10.1.2.3:6390: Error 111 connecting; NOPERM for user app"

        async def down(*args: Any, **kwargs: Any) -> Any:
            raise BackendError(secret)

        monkeypatch.setattr(backend, "enqueue", down)
        monkeypatch.setattr(backend, "list_jobs", down)
        written = await server.client.post("/v1/tasks", json={"type": "quick", "input": {}})
        message = assert_error(written, 503, "backend_unavailable")["message"]
        assert "10.1.2.3" not in message and "NOPERM" not in message
        assert "may have taken effect" in message and "Idempotency-Key" in message
        assert written.headers["Retry-After"] == "5"
        read = await server.client.get("/v1/tasks")
        message = assert_error(read, 503, "backend_unavailable")["message"]
        assert "10.1.2.3" not in message and "taken effect" not in message
