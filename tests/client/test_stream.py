"""stream() over a scripted transport: resume points, duplicates, pacing, giving up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from backburner.client import AsyncClient, Client, TransportError
from backburner.errors import JobNotFoundError

from .support import FakeClock, error, job_view, sse

TASK = "task_abc"


def ev(seq: int, type: str = "token", **data: Any) -> dict[str, Any]:
    return {"task_id": TASK, "seq": seq, "type": type, "data": data or {"text": f"t{seq}"}, "at": 1}


DONE = {"status": "completed"}


class Broken(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that delivers some bytes, then the connection drops."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self.body
        raise httpx.ReadError("connection reset by peer")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body
        raise httpx.ReadError("connection reset by peer")


class Server:
    """Answers event-stream requests from a script; GET /v1/tasks/{id} with ``status``."""

    def __init__(self, *answers: httpx.Response | Exception, status: str = "processing") -> None:
        self.answers = list(answers)
        self.status = status
        self.resumed: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return httpx.Response(200, json=job_view(self.status, TASK))
        self.resumed.append(request.headers.get("Last-Event-ID"))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def stream(body: bytes, broken: bool = False) -> httpx.Response:
    headers = {"Content-Type": "text/event-stream"}
    return httpx.Response(
        200,
        headers=headers,
        stream=Broken(body) if broken else None,
        content=None if broken else body,
    )


def client(server: Server, clock: FakeClock, **options: Any) -> Client:
    transport = httpx.MockTransport(server)
    return Client("http://api.test", transport=transport, sleep=clock.sleep, **options)


def test_resume_after_a_drop_keeps_the_servers_retry_and_skips_repeats() -> None:
    clock = FakeClock()
    server = Server(
        stream(sse(ev(1), ev(2), retry=200) + b"id: 3\ndata: {", broken=True),
        httpx.ConnectError("refused"),
        httpx.ConnectError("refused"),
        stream(sse(ev(2), ev(3), ev(4, "status", **DONE))),  # overlaps: 2 again
    )
    with client(server, clock) as c:
        seqs = [e.seq for e in c.stream(TASK)]
    assert seqs == [1, 2, 3, 4]
    assert server.resumed == [None, "2", "2", "2"]
    assert clock.sleeps == [0.0, 0.2, 0.4]  # at once after progress, then the server's retry


def test_a_clean_close_mid_job_reconnects_at_once() -> None:
    clock = FakeClock()
    server = Server(stream(sse(ev(1))), stream(sse(ev(2, "status", **DONE))))
    with client(server, clock) as c:
        assert [e.seq for e in c.stream(TASK, after=0)] == [1, 2]
    assert server.resumed == ["0", "1"] and clock.sleeps == [0.0]


def test_gives_up_after_max_reconnects_without_progress() -> None:
    clock = FakeClock()
    server = Server(*[stream(sse())] * 3)  # the server keeps closing at once, the job runs
    with (
        client(server, clock, max_reconnects=2, reconnect_delay=0.1) as c,
        pytest.raises(TransportError, match="broke 3 times in a row"),
    ):
        list(c.stream(TASK))
    assert clock.sleeps == [1.0, 2.0]  # the server's retry: 1000, doubled


def test_stream_errors() -> None:
    clock = FakeClock()
    server = Server(
        error(503, "backend_unavailable", "busy", **{"Retry-After": "4"}),
        error(404, "not_found", f"no job with id {TASK!r}"),
    )
    with client(server, clock) as c, pytest.raises(JobNotFoundError) as raised:
        list(c.stream(TASK))
    assert raised.value.task_id == TASK and clock.sleeps == [4.0]
    server = Server(stream(b"id: 1\nevent: token\ndata: not json\n\n"))
    with client(server, clock) as c, pytest.raises(Exception, match="unexpected answer"):
        list(c.stream(TASK))


async def test_async_stream_resumes_the_same_way() -> None:
    clock = FakeClock()
    server = Server(
        stream(sse(ev(1), ev(2)), broken=True),
        stream(sse(ev(3, "status", **DONE))),
    )
    transport = httpx.MockTransport(server)
    async with AsyncClient("http://api.test", transport=transport, sleep=clock.asleep) as c:
        assert [e.seq async for e in c.stream(TASK)] == [1, 2, 3]
    assert server.resumed == [None, "2"]
