"""The OpenAI-compatible provider against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from backburner.errors import (
    ContextLengthExceededError,
    ModelNotFoundError,
    ProviderAuthError,
    ProviderUnavailableError,
    QuotaExhaustedError,
    RateLimitedError,
    Retry,
    StreamInterruptedError,
)
from backburner.providers import GenerationRequest, Message, Usage
from backburner.providers.openai import OpenAIProvider

from ..helpers import free_port
from .fake_openai import FakeOpenAI


async def collect(provider: OpenAIProvider, model: str, max_tokens: int = 5) -> tuple[str, Usage]:
    request = GenerationRequest(
        model=model, messages=(Message("user", "hi"),), max_tokens=max_tokens
    )
    parts: list[str] = []
    usage = None
    async for item in provider.stream(request):
        if isinstance(item, Usage):
            usage = item
        else:
            parts.append(item)
    assert usage is not None
    return "".join(parts), usage


async def test_a_normal_stream_gives_the_text_and_the_reported_usage(fake: FakeOpenAI) -> None:
    provider = OpenAIProvider(fake.base_url, api_key="sk-test")
    try:
        text, usage = await collect(provider, "ok", max_tokens=5)
    finally:
        await provider.aclose()
    assert text == "alpha beta gamma delta epsilon"
    assert usage == Usage(7, 5, "length")
    body = fake.state.calls_of("ok")[-1].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 5


@pytest.mark.parametrize(
    ("model", "error", "retryable", "status"),
    [
        ("ratelimit", RateLimitedError, True, 429),
        ("quota", QuotaExhaustedError, False, 429),
        ("fail500", ProviderUnavailableError, True, 500),
        ("context", ContextLengthExceededError, False, 400),
        ("auth", ProviderAuthError, False, 401),
        ("missing", ModelNotFoundError, False, 404),
    ],
)
async def test_error_answers_map_to_typed_errors(
    fake: FakeOpenAI, model: str, error: type[Exception], retryable: bool, status: int
) -> None:
    provider = OpenAIProvider(fake.base_url)
    try:
        with pytest.raises(error) as caught:
            await collect(provider, model)
    finally:
        await provider.aclose()
    assert caught.value.retryable is retryable  # type: ignore[attr-defined]
    assert caught.value.status == status  # type: ignore[attr-defined]
    assert isinstance(caught.value, Retry) is retryable


async def test_retry_after_seconds_and_http_date_become_the_wait(fake: FakeOpenAI) -> None:
    provider = OpenAIProvider(fake.base_url)
    try:
        with pytest.raises(RateLimitedError) as seconds:
            await collect(provider, "ratelimit")
        with pytest.raises(RateLimitedError) as date:
            await collect(provider, "ratedate")
    finally:
        await provider.aclose()
    assert seconds.value.after == 1.0
    assert date.value.after is not None and 0.5 <= date.value.after <= 2.5  # whole seconds


async def test_a_stream_cut_mid_way_is_retryable_and_keeps_what_came(fake: FakeOpenAI) -> None:
    provider = OpenAIProvider(fake.base_url)
    parts: list[str] = []
    request = GenerationRequest(model="cut", messages=(Message("user", "hi"),), max_tokens=10)
    try:
        with pytest.raises(StreamInterruptedError) as caught:
            async for item in provider.stream(request):
                if isinstance(item, str):
                    parts.append(item)
    finally:
        await provider.aclose()
    assert parts == ["alpha", " beta", " gamma"]
    assert caught.value.retryable and "3 deltas" in str(caught.value)


async def test_a_refused_connection_is_retryable() -> None:
    provider = OpenAIProvider(f"http://127.0.0.1:{free_port()}/v1", connect_timeout_s=2)
    try:
        with pytest.raises(ProviderUnavailableError, match="ConnectError"):
            await collect(provider, "ok")
    finally:
        await provider.aclose()


async def test_a_silent_server_hits_the_read_timeout(fake: FakeOpenAI) -> None:
    provider = OpenAIProvider(fake.base_url, read_timeout_s=0.3)
    try:
        with pytest.raises(ProviderUnavailableError, match="ReadTimeout"):
            await collect(provider, "silent", max_tokens=3)  # a keep-alive, then silence
    finally:
        await provider.aclose()


async def test_stopping_early_closes_the_upstream_connection_at_once(fake: FakeOpenAI) -> None:
    model = f"slow.{uuid.uuid4().hex[:6]}"
    provider = OpenAIProvider(fake.base_url)
    parts: list[str] = []

    async def consume() -> None:
        async for item in provider.stream(
            GenerationRequest(model=model, messages=(Message("user", "x"),), max_tokens=100)
        ):
            parts.append(str(item))

    task = asyncio.create_task(consume())
    while len(parts) < 2:
        await asyncio.sleep(0.01)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 5
    call = fake.state.calls_of(model)[-1]
    while call.ended is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await provider.aclose()
    assert call.ended is not None, "the server never saw the client go"
    assert call.ended - cancelled_at < 1.0
    assert call.chunks_sent < 100


def test_the_request_body_carries_temperature_and_stop() -> None:
    provider = OpenAIProvider(
        "http://127.0.0.1:9/v1", transport=httpx.MockTransport(lambda r: httpx.Response(500))
    )
    body = provider.body(
        GenerationRequest(model="m", prompt="p", max_tokens=3, temperature=0.2, stop=("\n",))
    )
    assert body["temperature"] == 0.2 and body["stop"] == ["\n"]
    assert body["messages"] == [{"role": "user", "content": "p"}]
