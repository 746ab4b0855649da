"""The OpenAI-compatible provider on answers a well-behaved server never sends."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from backburner.errors import (
    ContextLengthExceededError,
    ProviderAuthError,
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


async def stream_with(
    handler: Callable[[httpx.Request], httpx.Response],
    request: GenerationRequest = REQUEST,
    **options: Any,
) -> list[str | Usage]:
    provider = OpenAIProvider(
        options.pop("base_url", "http://upstream.test/v1"),
        transport=httpx.MockTransport(handler),
        **options,
    )
    try:
        return [item async for item in provider.stream(request)]
    finally:
        await provider.aclose()


@pytest.mark.parametrize(
    ("options", "secret"),
    [
        ({"base_url": "http://alice:p@ss-SECRET@upstream.test/v1"}, "p@ss-SECRET"),
        ({"base_url": "http://TOKEN-SECRET-9@upstream.test/v1"}, "TOKEN-SECRET-9"),
        ({"headers": {"Authorization": "Bearer HDR-SECRET-1"}}, "HDR-SECRET-1"),
        ({"headers": {"api-key": "AZURE-SECRET-2"}}, "AZURE-SECRET-2"),
    ],
)
async def test_every_form_of_a_credential_is_masked(options: dict[str, Any], secret: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        echo = " ".join(f"{k}={v}" for k, v in request.headers.items()) + f" {request.url}"
        return httpx.Response(401, json={"error": {"message": echo}})

    with pytest.raises(ProviderAuthError) as caught:
        await stream_with(handler, **options)
    message = str(caught.value)
    for form in (secret, quote(secret, safe=""), base64.b64encode(secret.encode()).decode()):
        assert form not in message, message
    assert "***" in message


async def test_a_long_key_echoed_where_a_message_is_cut_is_masked_whole() -> None:
    key = "sk-proj-" + "A1b2C3d4" * 20
    parts = [f"data: unauthorized: Bearer {key}\n\n".encode()]  # not JSON: quoted, cut at 80
    with pytest.raises(StreamInterruptedError) as caught:
        await stream_with(
            lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)), api_key=key
        )
    assert "A1b2C3d4" not in str(caught.value) and "unauthorized: ***" in str(caught.value)


def echoing(request: httpx.Request) -> httpx.Response:
    echo = f"invalid {request.headers['authorization']} for {request.url}" + "!" * 5000
    return httpx.Response(401, json={"error": {"message": echo}})


@pytest.mark.parametrize(
    ("options", "shown"),
    [
        ({"api_key": "sk-SECRET-1"}, "invalid *** for http://upstream.test/v1/chat"),
        (
            {"base_url": "http://alice:pw-SECRET-2@upstream.test/v1"},
            "invalid Basic *** for http://***:***@upstream.test/v1/chat",
        ),
    ],
)
async def test_what_the_server_echoes_of_the_key_or_password_is_never_shown(
    options: dict[str, Any], shown: str
) -> None:
    with pytest.raises(ProviderAuthError) as caught:
        await stream_with(echoing, **options)
    message = str(caught.value)
    assert "SECRET" not in message and "YWxpY2U6cHctU0VDUkVULTI" not in message
    assert shown in message, message
    assert len(message) <= 2000 and message.endswith("…")


async def test_a_broken_stream_names_the_server_without_its_password() -> None:
    parts = [chunk("a")]
    with pytest.raises(StreamInterruptedError) as caught:
        await stream_with(
            lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)),
            base_url="http://alice:pw-SECRET@upstream.test/v1",
        )
    assert str(caught.value).startswith("http://upstream.test/v1: the stream ended without")


@pytest.mark.parametrize("value", ["sk-bad\nkey", "sk-ÉSECRET", "tab\there"])
async def test_a_header_no_request_can_carry_is_refused_without_showing_it(value: str) -> None:
    with pytest.raises(ProviderRequestError) as caught:
        OpenAIProvider("http://upstream.test/v1", api_key=value)
    assert "Authorization" in str(caught.value) and value not in str(caught.value)
    assert not caught.value.retryable


async def test_a_server_that_ignores_max_tokens_is_cut_off_as_at_the_limit() -> None:
    request = GenerationRequest(model="m", prompt="hi", max_tokens=16)  # 32 * 16 + 1024 chars
    parts = [chunk("x" * 100) for _ in range(1000)]
    items = await stream_with(
        lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)), request
    )
    text = "".join(item for item in items if isinstance(item, str))
    assert len(text) == 32 * 16 + 1024
    assert items[-1] == Usage(1, 16, "length", estimated=True)  # as at max_tokens


async def test_an_answer_of_long_tokens_within_max_tokens_is_not_cut() -> None:
    # Runs of spaces or dots are up to 16 characters a token (Gemma 3's tokenizer).
    request = GenerationRequest(model="m", prompt="hi", max_tokens=64)
    parts = [*[chunk(" " * 16) for _ in range(63)], chunk("end", "stop"), b"data: [DONE]\n\n"]
    items = await stream_with(
        lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)), request
    )
    assert "".join(i for i in items if isinstance(i, str)) == " " * 16 * 63 + "end"


async def test_an_endless_line_is_a_permanent_error_not_a_memory_blowup() -> None:
    parts = [b"data: " + b"x" * 65536 for _ in range(100)]  # 6.5 MB, never a line break
    with pytest.raises(ProviderRequestError, match="a line of over"):
        await stream_with(lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)))


async def test_lines_end_at_cr_lf_or_crlf_even_split_between_reads() -> None:
    first, second = chunk("a").replace(b"\n", b"\r\n"), chunk(" b", "stop")
    parts = [first[:-1], first[-1:] + second.replace(b"\n", b"\r"), b"data: [DONE]\r\n"]
    items = await stream_with(lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)))
    assert items[:2] == ["a", " b"]
    assert isinstance(items[2], Usage) and items[2].finish_reason == "stop"


async def test_silence_after_the_finish_reason_is_a_complete_answer() -> None:
    parts = [chunk("a"), chunk(" b", "stop")]
    error = httpx.ReadTimeout("no [DONE], no close")
    items = await run(lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts, error)))
    assert items[:2] == ["a", " b"]
    assert isinstance(items[2], Usage) and items[2].finish_reason == "stop"


async def test_the_content_type_is_read_whatever_its_case() -> None:
    headers = {"content-type": "Text/Event-Stream; charset=utf-8"}
    parts = [chunk("a", "stop"), b"data: [DONE]\n\n"]
    items = await run(lambda r: httpx.Response(200, headers=headers, stream=Chunks(parts)))
    assert items[0] == "a"


async def test_an_error_code_written_as_text_keeps_its_meaning() -> None:
    parts = [b'data: {"error": {"message": "bad value", "code": "400"}}\n\n']
    with pytest.raises(ProviderRequestError):
        await run(lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)))


async def test_the_answer_itself_is_never_masked() -> None:
    # Only error messages are: a user name that is also a word of the answer stays in it.
    parts = [chunk("hello alice"), chunk(", admin", "stop"), b"data: [DONE]\n\n"]
    items = await stream_with(
        lambda r: httpx.Response(200, headers=SSE, stream=Chunks(parts)),
        base_url="http://alice:pw-SECRET@upstream.test/v1",
        headers={"X-Api-Key": "admin"},
    )
    assert "".join(i for i in items if isinstance(i, str)) == "hello alice, admin"
