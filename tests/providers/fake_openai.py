"""A real HTTP server on loopback that speaks OpenAI's streaming chat completions protocol.

The model name ``KIND[-N][.TAG]`` picks the behaviour (``ok``, ``slow``, ``cut``, ...); ``-N``
makes a failing kind fail only the first N calls of that name; ``.TAG`` makes a name (and so its
call counter) unique to a test. The server records every call, how
many streams were open at once, and when each client went away.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..live_server import serve_in_thread

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


@dataclass
class Call:
    model: str
    body: dict[str, Any]
    started: float
    ended: float | None = None
    disconnected: float | None = None
    chunks_sent: int = 0


@dataclass
class FakeState:
    calls: list[Call] = field(default_factory=list)
    open_streams: dict[str, int] = field(default_factory=dict)
    max_open_streams: dict[str, int] = field(default_factory=dict)
    """Per model name: streams open now, and the most ever open at once."""
    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def calls_of(self, model: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.model == model]


def _chunk(text: str | None, finish: str | None = None) -> str:
    delta = {} if text is None else {"content": text}
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n"


def _usage_chunk(prompt_tokens: int, completion_tokens: int) -> str:
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"


def _error(status: int, message: str, code: str | None = None, **headers: str) -> Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def build_app(state: FakeState) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        full = str(body.get("model", "ok"))
        kind, _, limit = full.partition(".")[0].partition("-")
        call = Call(model=full, body=body, started=time.monotonic())
        with state.lock:
            state.calls.append(call)
            state.counts[full] = n = state.counts.get(full, 0) + 1
        failing = not limit or n <= int(limit)
        if kind == "auth":
            return _error(401, "Incorrect API key provided")
        if kind == "missing":
            return _error(404, f"The model `{full}` does not exist", "model_not_found")
        if kind == "context" and failing:
            return _error(
                400,
                "This model's maximum context length is 8192 tokens.",
                "context_length_exceeded",
            )
        if kind == "ratelimit" and failing:
            return _error(429, "Rate limit reached", "rate_limit_exceeded", **{"Retry-After": "1"})
        if kind == "quota" and failing:  # OpenAI's answer to an account out of credit
            body = {
                "error": {
                    "message": "You exceeded your current quota, please check your plan.",
                    "type": "insufficient_quota",
                    "code": "insufficient_quota",
                }
            }
            return JSONResponse(body, status_code=429)
        if kind == "ratedate" and failing:
            when = email.utils.formatdate(time.time() + 2, usegmt=True)
            return _error(429, "Rate limit reached", None, **{"Retry-After": when})
        if kind == "fail500" and failing:
            return _error(500, "The server had an error while processing your request")
        max_tokens = int(body.get("max_tokens", 16))
        pace = {"slow": 0.2, "limited": 0.05, "silent": 30.0}.get(kind, 0.0)
        cut_after = 3 if kind == "cut" and failing else None
        return StreamingResponse(
            _stream(state, call, max_tokens, pace, cut_after), media_type="text/event-stream"
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


async def _stream(
    state: FakeState, call: Call, max_tokens: int, pace: float, cut_after: int | None
) -> AsyncIterator[str]:
    with state.lock:
        now_open = state.open_streams[call.model] = state.open_streams.get(call.model, 0) + 1
        state.max_open_streams[call.model] = max(
            state.max_open_streams.get(call.model, 0), now_open
        )
    try:
        yield ": keep-alive\n\n"
        for i in range(max_tokens):
            if cut_after is not None and i == cut_after:
                raise ConnectionAbortedError("fake: cut the stream")  # uvicorn drops the socket
            if pace:
                await asyncio.sleep(pace)
            yield _chunk(("" if i == 0 else " ") + WORDS[i % len(WORDS)])
            call.chunks_sent += 1
        yield _chunk(None, "length")
        yield _usage_chunk(7, max_tokens)
        yield "data: [DONE]\n\n"
    except asyncio.CancelledError:
        call.disconnected = time.monotonic()
        raise
    finally:
        call.ended = time.monotonic()
        with state.lock:
            state.open_streams[call.model] -= 1


class FakeOpenAI:
    def __init__(self, server: uvicorn.Server, state: FakeState) -> None:
        self.server = server
        self.state = state

    @property
    def base_url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}/v1"


@contextmanager
def fake_openai() -> Iterator[FakeOpenAI]:
    """Serve the fake on 127.0.0.1 and a free port, in a thread, until exit."""
    state = FakeState()
    with serve_in_thread(build_app(state), name="fake-openai", lifespan="off") as (server, _):
        yield FakeOpenAI(server, state)


def main() -> None:
    """``python -m tests.providers.fake_openai``: serve until killed; print the base URL."""
    with fake_openai() as server:
        print(server.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
