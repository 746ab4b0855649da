"""Both clients against a real uvicorn server: the whole surface, and streams that get cut."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import httpx
import pytest

from backburner.client import AsyncClient, Client, Event, TransportError
from backburner.errors import InvalidTransitionError, JobNotFoundError
from tests.live_server import LiveServer

from .support import AsyncCuttingTransport, CuttingProxy, CuttingTransport, FakeClock

TOKENS = 30  # ~0.65 s of simulated generation: the stream is cut while the job runs


def assert_whole_log(events: list[Event]) -> None:
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # no gap, no repeat
    assert events[-1].type == "status" and events[-1].data["status"] == "completed"
    assert sum(e.type == "token" for e in events) == TOKENS


def resumed_from(requests: list[httpx.Request]) -> list[str | None]:
    return [r.headers.get("Last-Event-ID") for r in requests if r.url.path.endswith("/events")]


def test_sync_client_end_to_end(server: LiveServer) -> None:
    with Client(server.url, api_key="sk-ignored-for-now") as client:
        job = client.generate("end to end", max_tokens=5, metadata={"run": "live"})
        events = list(client.stream(job.task_id))
        assert events[-1].data["status"] == "completed"
        done = client.wait(job.task_id, timeout=30)
        assert done.result["text"] == "".join(e.data["text"] for e in events if e.type == "token")
        assert job.task_id in [t.task_id for t in client.list(type="generate", limit=1000).data]
        assert any(t.task_id == job.task_id for t in client.iter_tasks(page_size=2))
        later = client.submit("generate", {"prompt": "later"}, delay_s=600)
        with pytest.raises(InvalidTransitionError):
            client.delete(later.task_id)
        assert client.cancel(later.task_id).status == "cancelled"
        client.delete(later.task_id)
        with pytest.raises(JobNotFoundError):
            client.get(later.task_id)
        assert client.stats().counts["completed"] >= 1
        assert client.dead_letters().data == []


@pytest.mark.parametrize("clean", [False, True], ids=["read-error", "clean-close"])
def test_stream_resumes_after_a_cut(server: LiveServer, clean: bool) -> None:
    transport = CuttingTransport(events=4, cuts=2, clean=clean)
    with Client(server.url, transport=transport) as client:
        job = client.generate("cut me", max_tokens=TOKENS)
        events = list(client.stream(job.task_id))
    assert_whole_log(events)
    # Cut twice, each time mid-event, then resumed from the last whole event it had.
    assert resumed_from(transport.requests) == [None, "4", "8"]


async def test_async_stream_resumes_after_a_cut(server: LiveServer) -> None:
    transport = AsyncCuttingTransport(events=3)
    async with AsyncClient(server.url, transport=transport) as client:
        job = await client.generate("cut me async", max_tokens=TOKENS)
        events = [event async for event in client.stream(job.task_id)]
        assert (await client.wait(job.task_id)).status == "completed"
    assert_whole_log(events)
    assert resumed_from(transport.requests) == [None, "3"]


def test_stream_resumes_after_a_dropped_tcp_connection(server: LiveServer) -> None:
    proxy = CuttingProxy(server.url, events=5)
    try:
        with Client(proxy.url) as client:
            job = client.generate("cut the wire", max_tokens=TOKENS)
            events = list(client.stream(job.task_id))
    finally:
        proxy.close()
    assert_whole_log(events)
    assert proxy.cuts_left == 0 and proxy.connections >= 2


def test_stream_with_after_and_after_the_end(server: LiveServer) -> None:
    transport = CuttingTransport(events=1, cuts=0)
    with Client(server.url, transport=transport) as client:
        job = client.generate("resume", max_tokens=5)
        events = list(client.stream(job.task_id))
        assert [e.seq for e in client.stream(job.task_id, after=3)] == [e.seq for e in events[3:]]
        transport.requests.clear()
        assert list(client.stream(job.task_id, after=events[-1].seq)) == []
    # Two empty reads and two looks at the job, not a retry loop.
    assert [r.method for r in transport.requests] == ["GET"] * 4


def open_streams(server: LiveServer) -> int:
    hub = server.server.config.app.state.api.hub
    while True:
        try:
            return int(hub.subscriptions)
        except RuntimeError:  # the server thread changed the dict while we counted
            continue


def test_closing_a_stream_early_closes_its_connection(server: LiveServer) -> None:
    with Client(server.url) as client:
        job = client.submit("generate", {"prompt": "not yet"}, delay_s=600)
        stream = client.stream(job.task_id)
        assert next(stream).data == {"status": "queued"}  # the stream now waits for more
        assert open_streams(server) == 1
        stream.close()
        deadline = time.monotonic() + 10
        while open_streams(server) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert open_streams(server) == 0  # the server saw the disconnect
        client.cancel(job.task_id)


def test_unreachable_server_raises_transport_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    clock = FakeClock()
    with Client(f"http://127.0.0.1:{port}", sleep=clock.sleep, clock=clock) as client:
        with pytest.raises(TransportError, match="ConnectError"):
            client.get("task_x")
        assert clock.sleeps == [0.5, 1.0, 2.0]
        clock.sleeps.clear()
        with pytest.raises(TransportError, match="broke 6 times in a row"):
            list(client.stream("task_x"))
        assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0]


async def test_async_stream_closed_early_with_aclosing(server: LiveServer) -> None:
    async with AsyncClient(server.url) as client:
        job = await client.submit("generate", {"prompt": "not yet"}, delay_s=600)
        async with contextlib.aclosing(client.stream(job.task_id)) as events:
            async for event in events:
                assert event.data == {"status": "queued"}
                assert open_streams(server) == 1
                break
        deadline = time.monotonic() + 10
        while open_streams(server) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert open_streams(server) == 0
        await client.cancel(job.task_id)
