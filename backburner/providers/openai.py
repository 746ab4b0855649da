"""Any OpenAI-compatible chat completions endpoint (OpenAI, vLLM, Ollama, llama.cpp, LM Studio).

Streams ``POST {base_url}/chat/completions`` with ``stream: true`` and reads the server-sent
events with httpx; maps failures to ``ProviderError`` subclasses the retry policy understands.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from ..errors import (
    ContextLengthExceededError,
    ModelNotFoundError,
    ProviderAuthError,
    ProviderError,
    ProviderRequestError,
    ProviderUnavailableError,
    RateLimitedError,
    StreamInterruptedError,
)
from .base import GenerationRequest, Usage, estimate_tokens, parse_retry_after

_CONTEXT_HINTS = (
    "context_length",
    "context length",
    "maximum context",
    "context window",
    "exceed_context_size",
    "too many tokens",
    "prompt is too long",
)


class OpenAIProvider:
    """Chat completions over HTTP, streamed. One connection pool per provider."""

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
        headers: dict[str, str] | None = None,
        max_connections: int = 1000,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        hdrs = {"Accept": "text/event-stream", **(headers or {})}
        if api_key:
            hdrs["Authorization"] = f"Bearer {api_key}"
        # read_timeout_s bounds the silence between two chunks, not the whole call.
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, read=read_timeout_s)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=100)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=hdrs,
            timeout=timeout,
            limits=limits,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body of the chat completions call."""
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.as_messages()],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop"] = list(request.stop)
        return body

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[str | Usage, None]:
        """Yield text deltas, then the usage; closes the connection if the caller stops early."""
        produced: list[str] = []
        usage: dict[str, Any] | None = None
        finish: str | None = None
        done = False
        try:
            async with self._client.stream(
                "POST", "/chat/completions", json=self.body(request)
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_from_response(response, request.model)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # comments (": keep-alive"), event names, blank separators
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = _parse_chunk(data)
                    if chunk.get("error"):
                        raise _error_in_stream(chunk["error"], request.model)
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or ():
                        delta = (choice.get("delta") or {}).get("content")
                        if delta:
                            produced.append(delta)
                            yield delta
                        finish = choice.get("finish_reason") or finish
        except httpx.TimeoutException as exc:
            where = "mid-stream" if produced else "before the first token"
            kind = type(exc).__name__
            raise ProviderUnavailableError(f"{self.base_url}: {kind} {where}") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if produced:
                raise StreamInterruptedError(
                    f"{self.base_url}: the stream broke after {len(produced)} deltas ({exc})"
                ) from None
            raise ProviderUnavailableError(
                f"{self.base_url}: {exc or type(exc).__name__}"
            ) from None
        except httpx.TransportError as exc:  # connect refused, DNS, TLS, ...
            raise ProviderUnavailableError(
                f"{self.base_url}: {type(exc).__name__}: {exc or 'connection failed'}"
            ) from None
        if not done and finish is None:
            raise StreamInterruptedError(
                f"{self.base_url}: the stream ended without [DONE] after {len(produced)} deltas"
            )
        yield _usage(usage, request, "".join(produced), finish)


def _parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise StreamInterruptedError(
            f"the stream sent a chunk that is not JSON: {data[:80]!r}"
        ) from None
    if not isinstance(chunk, dict):
        raise StreamInterruptedError(
            f"the stream sent a chunk that is not an object: {data[:80]!r}"
        )
    return chunk


def _usage(
    reported: dict[str, Any] | None, request: GenerationRequest, text: str, finish: str | None
) -> Usage:
    prompt = reported.get("prompt_tokens") if reported else None
    completion = reported.get("completion_tokens") if reported else None
    if isinstance(prompt, int) and isinstance(completion, int):
        return Usage(prompt, completion, finish)
    sent = "".join(m.content for m in request.as_messages())
    return Usage(estimate_tokens(sent), estimate_tokens(text), finish, estimated=True)


def _message_of(payload: Any) -> tuple[str, str]:
    """(message, code-ish text) from an OpenAI-style error body, or from plain text."""
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            message = str(error.get("message") or error.get("detail") or error)
            code = " ".join(str(error.get(k) or "") for k in ("code", "type"))
            return message, code
        return str(error), ""
    return str(payload), ""


def error_from_response(response: httpx.Response, model: str) -> ProviderError:
    """The ProviderError for an HTTP error answer."""
    status = response.status_code
    try:
        payload: Any = response.json()
    except ValueError:
        payload = response.text[:500]
    message, code = _message_of(payload)
    text = f"{status} from {response.request.url.host}: {message}"
    after = parse_retry_after(response.headers.get("retry-after"))
    if status == 429 or (status == 503 and after is not None):
        return RateLimitedError(text, status=status, after=after)
    if status >= 500 or status == 408:
        return ProviderUnavailableError(text, status=status)
    if status in (401, 403):
        return ProviderAuthError(text, status=status)
    if status == 404:
        return ModelNotFoundError(f"{text} (model {model!r})", status=status)
    if _is_context_error(message + " " + code):
        return ContextLengthExceededError(text, status=status)
    return ProviderRequestError(text, status=status)


def _error_in_stream(error: Any, model: str) -> ProviderError:
    """An error object sent inside the event stream (vLLM, llama.cpp do this)."""
    message, code = _message_of({"error": error})
    if _is_context_error(message + " " + code):
        return ContextLengthExceededError(message)
    return StreamInterruptedError(f"the stream reported an error: {message}")


def _is_context_error(text: str) -> bool:
    lowered = text.lower()
    return any(hint in lowered for hint in _CONTEXT_HINTS)
