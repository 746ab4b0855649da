"""The OpenAI-compatible provider on answers a well-behaved server never sends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from backburner.errors import (
    ContextLengthExceededError,
    ProviderRequestError,
    ProviderUnavailableError,
    RateLimitedError,
    StreamInterruptedError,
)
from backburner.providers import GenerationRequest, Usage
from backburner.providers.openai import OpenAIProvider

SSE = {"content-type": "text/event-stream"}
REQUEST = GenerationRequest(model="m", prompt="hi", max_tokens=4)


def chunk(text: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


class Chunks(httpx.AsyncByteStream):
    """A response body that sends ``parts`` and then, optionally, breaks."""

    def __init__(self, parts: list[bytes], error: Exception | None = None) -> None:
        self.parts = parts
        self.error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        if self.error is not None:
            raise self.error


async def run(handler: Callable[[httpx.Request], httpx.Response]) -> list[str | Usage]:
    provider = OpenAIProvider("http://upstream.test/v1", transport=httpx.MockTransport(handler))
    try:
        return [item async for item in provider.stream(REQUEST)]
    finally:
        await provider.aclose()


async def test_a_redirect_is_a_permanent_configuration_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(301, headers={"location": "https://upstream.test/v1"})

    with pytest.raises(ProviderRequestError, match="redirect"):
        await run(handler)


async def test_a_server_that_ignores_stream_is_read_as_one_whole_answer() -> None:
    body = {
        "choices": [{"message": {"content": "whole text"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    assert await run(lambda r: httpx.Response(200, json=body)) == [
        "whole text",
        Usage(3, 2, "stop"),
    ]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"error": {"message": "too many requests", "code": 429}}, RateLimitedError),
        (
            {"error": {"message": "maximum context length is 2048", "code": 400}},
            ContextLengthExceededError,
        ),
        ({"error": {"message": "bad value", "code": 400}}, ProviderRequestError),
        ({"unexpected": True}, ProviderRequestError),
    ],
)
async def test_json_errors_in_a_200_are_mapped(
    body: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        await run(lambda r: httpx.Response(200, json=body))


async def test_an_html_page_from_a_proxy_is_not_retried() -> None:
    with pytest.raises(ProviderRequestError, match="not an event stream"):
        await run(lambda r: httpx.Response(200, html="<html>login</html>"))


async def test_a_malformed_chunk_is_an_interrupted_stream() -> None:
    bad = b'data: {"choices": ["x"]}\n\n'
    with pytest.raises(StreamInterruptedError, match="malformed"):
        await run(lambda r: httpx.Response(200, headers=SSE, stream=Chunks([bad])))


async def test_an_error_object_mid_stream_keeps_its_meaning() -> None:
    parts = [chunk("a"), b'data: {"error": {"message": "slow down", "code": 429}}\n\n']
    with pytest.raises(RateLimitedError):
        await run(lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)))


async def test_a_break_after_the_finish_reason_is_a_complete_answer() -> None:
    parts = [chunk("a"), chunk(" b", "stop")]
    error = httpx.ReadError("connection reset")
    items = await run(lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts, error)))
    assert items[:2] == ["a", " b"]
    assert isinstance(items[2], Usage) and items[2].finish_reason == "stop"


async def test_a_body_that_does_not_decode_is_retryable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {**SSE, "content-encoding": "gzip"}
        return httpx.Response(200, headers=headers, content=b"not gzip at all")

    with pytest.raises(ProviderUnavailableError, match="DecodingError"):
        await run(handler)


async def test_bogus_usage_counts_are_replaced_by_estimates() -> None:
    usage = {"prompt_tokens": True, "completion_tokens": -3}
    parts = [chunk("abcd", "stop"), f"data: {json.dumps({'usage': usage})}\n\n".encode()]
    items = await run(lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)))
    assert items[-1] == Usage(1, 1, "stop", estimated=True)


async def test_stream_usage_can_be_turned_off_for_servers_that_refuse_it() -> None:
    provider = OpenAIProvider("http://upstream.test/v1", stream_usage=False)
    assert "stream_options" not in provider.body(REQUEST)
    await provider.aclose()
