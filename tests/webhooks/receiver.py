"""A real webhook receiver on loopback: answers each path from a plan, records every request."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..live_server import serve_in_thread


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    """time.time() when the request arrived."""


@dataclass
class Answer:
    status: int = 204
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None
    """If given, the answer waits until it is set (a receiver that hangs)."""
    body: str = ""
    """``trickle``: a byte every 0.2 s for a minute; ``endless``: 64 KB chunks forever."""


class ReceiverState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[Received] = []
        self.plans: dict[str, list[Answer]] = {}
        self.arrived = threading.Condition(self.lock)

    def plan(self, path: str, *answers: Answer) -> None:
        """Answer the next requests to ``path`` with these, then 204."""
        with self.lock:
            self.plans[path] = list(answers)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def wait_for(self, path: str, count: int, timeout: float = 20.0) -> list[Received]:
        """Block (a thread: use asyncio.to_thread) until ``count`` requests reached ``path``."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len([r for r in self.received if r.path == path]) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{count} requests to {path} not received in {timeout}s")
                self.arrived.wait(left)
            return [r for r in self.received if r.path == path]


async def _trickle() -> AsyncIterator[bytes]:
    for _ in range(300):
        yield b"."
        await asyncio.sleep(0.2)


async def _endless() -> AsyncIterator[bytes]:
    chunk = b"x" * 65536
    while True:
        yield chunk
        await asyncio.sleep(0)


_BODIES = {"trickle": _trickle, "endless": _endless}


def build_app(state: ReceiverState) -> Starlette:
    async def hook(request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        with state.arrived:
            state.received.append(Received(path, dict(request.headers), body, time.time()))
            plan = state.plans.get(path) or []
            answer = plan.pop(0) if plan else Answer()
            state.arrived.notify_all()
        if answer.hold is not None:
            await asyncio.to_thread(answer.hold.wait, 30)
        if answer.body:
            return StreamingResponse(
                _BODIES[answer.body](), status_code=answer.status, headers=answer.headers
            )
        return Response(status_code=answer.status, headers=answer.headers)

    return Starlette(routes=[Route("/{rest:path}", hook, methods=["POST"])])


class Receiver:
    def __init__(self, server: uvicorn.Server, state: ReceiverState, port: int) -> None:
        self.server = server
        self.state = state
        self.port = port

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def receiver(port: int = 0, state: ReceiverState | None = None) -> Iterator[Receiver]:
    """Serve a receiver on 127.0.0.1 (``port`` 0: a free one), in a thread, until exit."""
    state = state or ReceiverState()
    app = build_app(state)
    with serve_in_thread(app, port=port, name="webhook-receiver", lifespan="off") as (server, _):
        bound = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield Receiver(server, state, bound)
        finally:
            for plan in state.plans.values():
                for answer in plan:
                    if answer.hold is not None:
                        answer.hold.set()
