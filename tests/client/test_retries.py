"""Which requests are repeated, after what, and the typed errors, over a scripted transport."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from backburner.client import APIError, AsyncClient, Client, TransportError
from backburner.client._http import Call
from backburner.errors import (
    AuthError,
    BackendError,
    CorruptRecordError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidTransitionError,
    JobNotFoundError,
    LimitExceededError,
    MalformedAuthError,
    PermissionDeniedError,
    QueueFullError,
    QuotaExceededError,
    SubmitRateLimitedError,
    UnknownTaskError,
)

from .support import FakeClock, error, job_view

ACCEPTED = {
    "task_id": "task_abc",
    "status": "queued",
    "estimated_time_sec": None,
    "poll_url": "/v1/tasks/task_abc",
    "stream_url": "/v1/tasks/task_abc/events",
}

Answer = httpx.Response | Exception


class Script:
    """Answers requests from a list, in order, and records them with the fake time."""

    def __init__(self, clock: FakeClock, *answers: Answer) -> None:
        self.clock = clock
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(self.clock.now)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def refused() -> httpx.ConnectError:
    return httpx.ConnectError("connection refused")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def scripted(clock: FakeClock) -> Callable[..., tuple[Client, Script]]:
    made: list[Client] = []

    def make(*answers: Answer, **options: Any) -> tuple[Client, Script]:
        script = Script(clock, *answers)
        client = Client(
            "http://api.test",
            transport=httpx.MockTransport(script),
            sleep=clock.sleep,
            clock=clock,
            **options,
        )
        made.append(client)
        return client, script

    yield make
    for client in made:
        client.close()


def test_get_is_retried_on_503_honouring_retry_after(scripted: Any, clock: FakeClock) -> None:
    client, script = scripted(
        error(503, "backend_unavailable", "database is locked", **{"Retry-After": "2"}),
        error(502, "http_error", "bad gateway"),
        httpx.Response(200, json=job_view("completed")),
    )
    assert client.get("task_abc").status == "completed"
    assert script.times == [0, 2, 3]  # Retry-After 2, then the backoff of a 2nd retry (1 s)


def test_connection_errors_are_retried_then_raised(scripted: Any, clock: FakeClock) -> None:
    client, script = scripted(refused(), refused(), refused(), refused())
    with pytest.raises(TransportError, match="after 4 attempts") as raised:
        client.get("task_abc")
    assert isinstance(raised.value.__cause__, httpx.ConnectError)
    assert clock.sleeps == [0.5, 1.0, 2.0]
    assert len(script.requests) == 4


def test_connection_error_then_success(scripted: Any) -> None:
    client, script = scripted(httpx.ReadTimeout("slow"), httpx.Response(204))
    client.delete("task_abc")
    assert [r.method for r in script.requests] == ["DELETE", "DELETE"]


def test_submit_retries_with_the_same_idempotency_key(scripted: Any) -> None:
    client, script = scripted(
        httpx.RemoteProtocolError("peer closed connection"),
        error(503, "backend_unavailable", "busy", **{"Retry-After": "1"}),
        httpx.Response(200, json=ACCEPTED),  # the first try had landed after all
    )
    job = client.submit("echo", {"text": "x"})
    keys = {r.headers["Idempotency-Key"] for r in script.requests}
    assert len(script.requests) == 3 and len(keys) == 1
    assert job.created  # our own made-up key: only our earlier try can have created it
    chosen, script2 = scripted(httpx.Response(200, json=ACCEPTED))
    assert not chosen.submit("echo", idempotency_key="mine").created
    assert script2.requests[0].headers["Idempotency-Key"] == "mine"


def test_post_without_idempotency_key_is_never_retried(scripted: Any) -> None:
    client, script = scripted(error(503, "backend_unavailable", "busy"), refused())
    with pytest.raises(BackendError):
        client.replay("task_abc")  # replay carries no key
    assert len(script.requests) == 1
    raw = Call("POST", "/v1/tasks", json={"type": "echo"}, idempotent=False)
    with pytest.raises(TransportError):
        client._send(raw)
    assert len(script.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422, 500])
def test_other_answers_are_not_retried(scripted: Any, status: int) -> None:
    client, script = scripted(error(status, "whatever", "no"))
    with pytest.raises(APIError):
        client.get("task_abc")
    assert len(script.requests) == 1


def test_retry_after_beyond_the_bound_is_not_waited_for(scripted: Any, clock: FakeClock) -> None:
    client, _ = scripted(error(429, "queue_full", "full", **{"Retry-After": "3600"}))
    with pytest.raises(QueueFullError) as raised:
        client.get("task_abc")
    assert raised.value.retry_after == 3600 and clock.sleeps == []


@pytest.mark.parametrize(
    ("status", "type_", "classes"),
    [
        (404, "not_found", (JobNotFoundError,)),
        (409, "idempotency_conflict", (IdempotencyConflictError,)),
        (409, "invalid_state", (InvalidTransitionError,)),
        (400, "invalid_json", (InvalidInputError,)),
        (400, "invalid_body", (InvalidInputError,)),
        (413, "body_too_large", (InvalidInputError,)),
        (422, "invalid_request", (InvalidInputError,)),
        (422, "unknown_task", (UnknownTaskError, InvalidInputError)),
        (429, "queue_full", (QueueFullError,)),
        (503, "backend_unavailable", (BackendError,)),
        (500, "corrupt_record", (CorruptRecordError, BackendError)),
        (500, "internal_error", ()),
        (401, "unauthorized", (AuthError,)),
        (403, "forbidden", (PermissionDeniedError, AuthError)),
        (400, "invalid_authorization", (MalformedAuthError, AuthError)),
        (429, "quota_exceeded", (QuotaExceededError, LimitExceededError)),
        (429, "rate_limited", (SubmitRateLimitedError, LimitExceededError)),
        (418, "teapot", ()),
    ],
)
def test_errors_are_typed(
    scripted: Any, status: int, type_: str, classes: tuple[type[Exception], ...]
) -> None:
    client, _ = scripted(*[error(status, type_, f"the {type_} message")] * 4)
    with pytest.raises(APIError) as raised:
        client.cancel("task_abc")
    exc = raised.value
    assert (exc.status, exc.type, exc.message, str(exc)) == (
        status,
        type_,
        f"the {type_} message",
        f"the {type_} message",
    )
    for cls in classes:
        assert isinstance(exc, cls)
    if isinstance(exc, CorruptRecordError):
        assert (exc.task_id, exc.reason) == ("task_abc", f"the {type_} message")
    if not classes:
        assert type(exc) is APIError


def test_an_error_that_is_not_ours(scripted: Any) -> None:
    page = httpx.Response(502, text="<html><h1>502 Bad Gateway</h1></html>")
    client, _ = scripted(page, page, page, page)
    with pytest.raises(APIError) as raised:
        client.get("task_abc")
    assert (raised.value.status, raised.value.type) == (502, "http_error")
    assert "502 Bad Gateway" in raised.value.message


def test_an_answer_that_does_not_parse(scripted: Any) -> None:
    client, _ = scripted(httpx.Response(200, json={"task_id": 1}))
    with pytest.raises(APIError) as raised:
        client.get("task_abc")
    assert raised.value.type == "invalid_response"


def test_headers_and_paths(scripted: Any) -> None:
    client, script = scripted(
        httpx.Response(200, json=job_view()),
        httpx.Response(200, json={"data": [job_view()], "next_cursor": None}),
        api_key="sk-test",
    )
    client.get("../stats")
    client.list(status="queued", type="echo", limit=5, cursor="c1")
    first, second = script.requests
    assert first.headers["Authorization"] == "Bearer sk-test"
    assert first.headers["User-Agent"].startswith("backburner-client/")
    assert first.url.raw_path == b"/v1/tasks/..%2Fstats"  # an id cannot escape its path
    assert dict(second.url.params) == {
        "status": "queued",
        "type": "echo",
        "cursor": "c1",
        "limit": "5",
    }


async def test_async_client_retries_the_same_way(clock: FakeClock) -> None:
    script = Script(
        clock,
        refused(),
        error(503, "backend_unavailable", "busy", **{"Retry-After": "3"}),
        httpx.Response(200, json=job_view("processing")),
        error(503, "backend_unavailable", "busy"),
    )
    async with AsyncClient(
        "http://api.test", transport=httpx.MockTransport(script), sleep=clock.asleep, clock=clock
    ) as client:
        assert (await client.get("task_abc")).status == "processing"
        assert script.times == [0, 0.5, 3.5]
        with pytest.raises(BackendError):
            await client.replay("task_abc")
        assert len(script.requests) == 4


def test_a_delete_whose_answer_was_lost_still_succeeds() -> None:
    """First try: the server deletes, then the connection drops before the 204 arrives. The
    retry then gets 404: the delete did happen, so it is not an error."""
    answers = iter(["drop", 404])
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        answer = next(answers)
        if answer == "drop":
            raise httpx.ReadError("connection reset", request=request)
        body = {"error": {"type": "not_found", "message": "no job with id 'task_x'"}}
        return httpx.Response(404, json=body)

    with Client(
        "http://api.test", transport=httpx.MockTransport(handler), sleep=lambda s: None
    ) as client:
        client.delete("task_x")
    assert seen == ["DELETE", "DELETE"]


def test_a_delete_of_a_missing_job_is_not_found() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"error": {"type": "not_found", "message": "no job with id 'task_x'"}}
        return httpx.Response(404, json=body)

    with (
        Client("http://api.test", transport=httpx.MockTransport(handler)) as client,
        pytest.raises(JobNotFoundError),
    ):
        client.delete("task_x")


class _CutStream(httpx.SyncByteStream):
    def __iter__(self) -> Any:
        yield b'{"custom_id": "a", "status": "completed"}\n'
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")


def test_batch_results_are_opened_with_retries_and_fail_typed(
    scripted: Any, clock: FakeClock
) -> None:
    # They went straight to httpx: raw httpx errors, and no retry of a 503 or a refusal.
    rows = b'{"custom_id": "a", "status": "completed"}\n{"custom_id": "b", "status": "failed"}\n'
    client, script = scripted(
        refused(),
        error(503, "backend_unavailable", "busy", **{"Retry-After": "2"}),
        httpx.Response(200, content=rows, headers={"content-type": "application/x-ndjson"}),
    )
    assert [r["custom_id"] for r in client.batch_results("task_abc")] == ["a", "b"]
    assert clock.sleeps == [0.5, 2.0] and len(script.requests) == 3
    down, _ = scripted(refused(), refused(), refused(), refused())
    with pytest.raises(TransportError, match="after 4 attempts"):
        list(down.batch_results("task_abc"))
    cut, _ = scripted(httpx.Response(200, stream=_CutStream()))
    got: list[dict[str, Any]] = []
    with pytest.raises(TransportError, match="cut off"):
        got.extend(cut.batch_results("task_abc"))
    assert [r["custom_id"] for r in got] == ["a"]
    missing, _ = scripted(error(404, "not_found", "no batch task_abc"))
    with pytest.raises(JobNotFoundError):
        list(missing.batch_results("task_abc"))


def test_no_error_shows_the_api_key_or_the_urls_password(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backburner.errors import ConfigurationError

    secret = "bb_" + "k" * 40
    for bad in (secret + "\n x", "bb_ключ", " "):  # a newline inside, not ASCII, blank
        with pytest.raises(ConfigurationError, match="printable ASCII") as raised:
            Client("http://api.test", api_key=bad)
        assert "k" * 40 not in str(raised.value) and "ключ" not in str(raised.value)
    monkeypatch.setenv("BACKBURNER_API_KEY", secret + "\n")  # as read from a file: fine
    client = Client("http://api.test", transport=httpx.MockTransport(lambda r: httpx.Response(204)))
    client.delete("task_abc")
    client.close()
    down = Client(
        "http://admin:s3cret@api.test",
        transport=httpx.MockTransport(lambda r: (_ for _ in ()).throw(refused())),
        max_retries=0,
    )
    with pytest.raises(TransportError) as failed:
        down.get("task_abc")
    down.close()
    assert "s3cret" not in str(failed.value) and "api.test" in str(failed.value)


def test_what_cannot_be_sent_is_an_invalid_input_error_and_nothing_is_sent(
    scripted: Any,
) -> None:
    # A set or NaN in the input was a TypeError from httpx, or JSON the API cannot read; a
    # newline in the key was reported as "could not reach the API".
    client, script = scripted()
    for odd in ({"x": {1, 2}}, {"x": float("nan")}, {"x": object()}):
        with pytest.raises(InvalidInputError, match="cannot be sent as JSON"):
            client.submit("echo", odd)
    for key in ("a\nb", "ключ", "", "k" * 256):
        with pytest.raises(InvalidInputError, match="idempotency_key"):
            client.submit("echo", {}, idempotency_key=key)
    with pytest.raises(InvalidInputError, match="cannot be sent as JSON"):
        client.submit_batch([{"custom_id": "a", "prompt": "x", "metadata": {1}}])
    assert script.requests == []
