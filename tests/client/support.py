"""Helpers for the client tests: an app with extra tasks, fake clocks, job views, cutters."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from backburner import Backburner, Event, JobContext, PermanentError, Settings
from backburner.api import create_app
from backburner.backends import Backend
from backburner.backends.memory import MemoryBackend

FAST = {
    "cancel_poll_s": 0.05,
    "sweep_interval_s": 0.2,
    "heartbeat_s": 0.5,
    "lease_s": 5.0,
    "retry_base_s": 0.01,
    "retry_cap_s": 0.05,
    "idle_wait_s": 0.2,
}


def make_app(backend: Backend | None = None, **overrides: Any) -> Any:
    """The real API over a memory backend, with a worker, plus a few test tasks."""
    run_worker = overrides.pop("run_worker", True)
    settings = Settings(**{"backend_url": "memory://", **FAST, **overrides})
    bb = Backburner(backend, settings=settings)

    @bb.task(max_attempts=1)
    async def boom(ctx: JobContext, reason: str = "boom") -> None:
        raise PermanentError(reason)

    @bb.task
    async def echo(ctx: JobContext, text: str = "") -> dict[str, str]:
        await ctx.emit("token", {"text": text})
        return {"text": text}

    @bb.task
    async def slowpoke(ctx: JobContext, seconds: float = 0.1) -> str:
        await asyncio.sleep(seconds)
        return "done"

    return create_app(settings, backburner=bb, run_worker=run_worker)


class SlowEmptyReads(MemoryBackend):
    """Widens the window between an event stream's read of new events and its look at the job
    (the server ends a stream when the first finds nothing and the second sees a finished job)."""

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        found = await super().events(task_id, after=after, limit=limit)
        if not found:
            await asyncio.sleep(0.3)  # the job finishes meanwhile
        return found


class FakeClock:
    """Time that moves only when the client sleeps; the tests read when each request left."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def job_view(status: str = "queued", task_id: str = "task_abc", **extra: Any) -> dict[str, Any]:
    """A JobView body as the API sends it."""
    return {
        "task_id": task_id,
        "type": "generate",
        "status": status,
        "priority": 0,
        "input": {},
        "created_at": 1.0,
        "started_at": None,
        "finished_at": None,
        "attempts": 0,
        "max_attempts": 3,
        "progress": {"percent": 0.0, "message": None},
        "result": None,
        "error": None,
        "usage": None,
        "estimated_time_sec": None,
        "estimated_remaining_sec": None,
        "metadata": {},
        "webhook_url": None,
        "webhook_progress": False,
        "expires_at": None,
        "history": [],
        **extra,
    }


def error(status: int, type: str, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"type": type, "message": message}}, headers=headers
    )


def sse(*events: dict[str, Any], retry: int | None = 1000) -> bytes:
    """An event-stream body for these events (dicts of Event fields), as the server writes."""
    out = [] if retry is None else [f"retry: {retry}\n\n".encode()]
    for e in events:
        out.append(f"id: {e['seq']}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())
    return b"".join(out)


# -- cutting a stream after N events ----------------------------------------------------------


def _event_ends(buffer: bytes) -> list[int]:
    """Offsets just past each complete event that carries an id."""
    ends, start = [], 0
    while (stop := buffer.find(b"\n\n", start)) != -1:
        if b"id:" in buffer[start:stop]:
            ends.append(stop + 2)
        start = stop + 2
    return ends


class _Cutter:
    """Passes a stream through until ``events`` events and a few bytes of the next went by."""

    def __init__(self, events: int, clean: bool) -> None:
        self.events = events
        self.clean = clean
        self.buffer = b""
        self.sent = 0
        self.done = False

    def take(self, chunk: bytes) -> bytes:
        self.buffer += chunk
        ends = _event_ends(self.buffer)
        if len(ends) >= self.events and len(self.buffer) > ends[self.events - 1] + 4:
            self.done = True
            stop = ends[self.events - 1] + 4  # half an event: the client must drop it
            out, self.sent = self.buffer[self.sent : stop], stop
            return out
        out, self.sent = self.buffer[self.sent :], len(self.buffer)
        return out

    def cut(self) -> None:
        if not self.clean:
            raise httpx.ReadError("connection cut by the test")


class _CutStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, cutter: _Cutter) -> None:
        self.inner, self.cutter = inner, cutter

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            yield self.cutter.take(chunk)
            if self.cutter.done:
                self.cutter.cut()
                return

    def close(self) -> None:
        self.inner.close()


class _AsyncCutStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, cutter: _Cutter) -> None:
        self.inner, self.cutter = inner, cutter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield self.cutter.take(chunk)
            if self.cutter.done:
                self.cutter.cut()
                return

    async def aclose(self) -> None:
        await self.inner.aclose()


class CuttingTransport(httpx.BaseTransport):
    """A real HTTP transport that cuts the first ``cuts`` event streams after ``events`` each."""

    def __init__(self, events: int, *, cuts: int = 1, clean: bool = False) -> None:
        self.inner = httpx.HTTPTransport()
        self.events, self.cuts, self.clean = events, cuts, clean
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/events") and self.cuts > 0:
            self.cuts -= 1
            assert isinstance(response.stream, httpx.SyncByteStream)
            response.stream = _CutStream(response.stream, _Cutter(self.events, self.clean))
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncCuttingTransport(httpx.AsyncBaseTransport):
    """The asyncio twin of ``CuttingTransport``."""

    def __init__(self, events: int, *, cuts: int = 1, clean: bool = False) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.events, self.cuts, self.clean = events, cuts, clean
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/events") and self.cuts > 0:
            self.cuts -= 1
            assert isinstance(response.stream, httpx.AsyncByteStream)
            response.stream = _AsyncCutStream(response.stream, _Cutter(self.events, self.clean))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class CuttingProxy:
    """A TCP proxy that drops the connection of the first event stream after N events.

    The cut is a real one: the client sees its socket close in the middle of a chunked body.
    """

    def __init__(self, upstream: str, events: int) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.events = events
        self.cuts_left = 1
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.closing = False
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self.threads.append(accept)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self.lock:
                self.connections += 1
                self.sockets += [client, upstream]
            watch: dict[str, bool] = {"events": False}
            for args in ((client, upstream, watch, True), (upstream, client, watch, False)):
                pump = threading.Thread(target=self._pump, args=args, daemon=True)
                pump.start()
                self.threads.append(pump)

    def _pump(self, src: socket.socket, dst: socket.socket, watch: dict[str, bool], up: bool):
        seen = 0
        try:
            while data := src.recv(65536):
                if up and b"/events" in data:
                    with self.lock:
                        if self.cuts_left:
                            self.cuts_left -= 1
                            watch["events"] = True
                dst.sendall(data)
                if not up and watch["events"]:
                    seen += data.count(b"id: ")
                    if seen >= self.events:
                        break  # cut: close both ends now
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.closing = True
        with self.lock:
            sockets = [self.listener, *self.sockets]
        for s in sockets:  # shutdown wakes the threads blocked in accept() or recv()
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(5)
            assert not t.is_alive()
