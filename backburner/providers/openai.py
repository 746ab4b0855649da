"""Any OpenAI-compatible chat completions endpoint (OpenAI, vLLM, Ollama, llama.cpp, LM Studio).

Streams ``POST {base_url}/chat/completions`` with ``stream: true`` and reads the server-sent
events with httpx; maps failures to ``ProviderError`` subclasses the retry policy understands.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx

from ..errors import (
    ContextLengthExceededError,
    ModelNotFoundError,
    ProviderAuthError,
    ProviderError,
    ProviderRequestError,
    ProviderUnavailableError,
    QuotaExhaustedError,
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
        stream_usage: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.shown_url = without_userinfo(self.base_url)
        """The base URL as messages and logs show it: no user name or password."""
        self.stream_usage = stream_usage
        """Send ``stream_options.include_usage`` (off for servers that refuse it)."""
        # identity: a compressed answer would be inflated whole before any size limit saw it
        hdrs = {"Accept": "text/event-stream", "Accept-Encoding": "identity", **(headers or {})}
        if api_key:
            hdrs["Authorization"] = f"Bearer {api_key}"
        for name, value in hdrs.items():
            if not _HEADER_VALUE.fullmatch(value):  # (its value is never shown: it may be a key)
                raise ProviderRequestError(
                    f"{self.shown_url}: header {name!r} holds characters an HTTP header cannot"
                    " carry (a line break, a control or non-ASCII character)"
                )
        self._secrets = _secrets(self.base_url, api_key, hdrs)
        """Whatever the server or a library may echo of these is masked in every message."""
        # read_timeout_s bounds the silence between two chunks; timeout_s the wait for a pooled
        # connection and for sending the request. The job's timeout bounds the whole call.
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
            "max_tokens": request.max_tokens,
        }
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop"] = list(request.stop)
        return body

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[str | Usage, None]:
        """Yield text deltas, then the usage; closes the connection if the caller stops early."""
        produced: list[str] = []
        cut = False
        usage: dict[str, Any] | None = None
        finish: str | None = None
        done = False
        try:
            async with self._client.stream(
                "POST", "/chat/completions", json=self.body(request)
            ) as response:
                if not 200 <= response.status_code < 300:
                    body = await _read_at_most(response, ERROR_BODY_BYTES)
                    raise error_from_response(response, request.model, body)
                content_type = response.headers.get("content-type", "").lower()
                if "text/event-stream" not in content_type:
                    # A server that ignored "stream": a whole answer, or an error, as JSON.
                    body = await _read_at_most(response, _size_limit(request))
                    for item in _whole_answer(response, request, body):
                        yield item
                    return
                # Past this many characters the server ignores max_tokens: the answer ends
                # there, as at max_tokens. A token is about 4 characters of prose, up to 16 of
                # a run of spaces or dots (Gemma 3's tokenizer): 32 is room for any answer.
                allowed, chars = CHARS_PER_TOKEN * request.max_tokens + 1024, 0
                async for line in _lines(response, _size_limit(request)):
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
                    for delta, reason in _choices(chunk):
                        if delta:
                            delta = delta[: allowed - chars]
                            chars += len(delta)
                            produced.append(delta)
                            yield delta
                        finish = reason or finish
                    if chars >= allowed:
                        cut = True
                        break
        except httpx.TimeoutException as exc:
            if finish is None:  # silent after the model finished (before [DONE]): complete
                where = "mid-stream" if produced else "before the first token"
                kind = type(exc).__name__
                raise ProviderUnavailableError(f"{self.shown_url}: {kind} {where}") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if finish is None:  # broken after the model finished (before [DONE]): complete
                if produced:
                    raise StreamInterruptedError(
                        self._clean(
                            f"{self.shown_url}: the stream broke after {len(produced)} deltas"
                            f" ({exc})"
                        )
                    ) from None
                raise ProviderUnavailableError(
                    self._clean(f"{self.shown_url}: {exc or type(exc).__name__}")
                ) from None
        except httpx.TransportError as exc:  # connect refused, DNS, TLS, ...
            raise ProviderUnavailableError(
                self._clean(f"{self.shown_url}: {type(exc).__name__}: {exc or 'connection failed'}")
            ) from None
        except httpx.HTTPError as exc:  # a body that does not decode, ...
            kind = type(exc).__name__
            raise ProviderUnavailableError(
                self._clean(f"{self.shown_url}: {kind}: {exc}")
            ) from None
        except ProviderError as exc:  # the server's words may echo what it was sent
            exc.args = (self._clean(str(exc)),)
            raise
        if cut:  # as at max_tokens: what the server says of its count is not to be trusted
            sent = "".join(m.content for m in request.as_messages())
            yield Usage(estimate_tokens(sent), request.max_tokens, "length", estimated=True)
            return
        if not done and finish is None:
            raise StreamInterruptedError(
                f"{self.shown_url}: the stream ended without [DONE] after {len(produced)} deltas"
            )
        yield _usage(usage, request, "".join(produced), finish)

    def _masked(self, text: str) -> str:
        """``text`` without the key, password or credentials this provider sends."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text

    def _clean(self, text: str) -> str:
        """``_masked`` text, at most MESSAGE_CHARS long (masked first: a cut through a
        secret would leave part of it)."""
        text = self._masked(text)
        return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


CHARS_PER_TOKEN = 32
"""A stream past this many characters a token of max_tokens (plus 1,024) is cut there."""

ERROR_BODY_BYTES = 64 * 1024
"""Of an error answer, this much is read: its message is all it is read for."""

MESSAGE_CHARS = 2000
"""A provider error's message (what the job's error shows) is cut to this length."""

_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def without_userinfo(url: str) -> str:
    """``url`` without its user name and password (as messages and logs show it)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _size_limit(request: GenerationRequest) -> int:
    """The most a whole (not streamed) answer, or one line of an event stream, may take:
    64 bytes a token of max_tokens, and 64 KB of room (a chunk of one delta is far shorter)."""
    return 64 * 1024 + 64 * request.max_tokens


async def _read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The first ``limit`` bytes of the body (the rest is never read: the connection closes)."""
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) >= limit:
            break
    return bytes(body[:limit])


async def _lines(response: httpx.Response, limit: int) -> AsyncGenerator[str, None]:
    """The lines of an event stream (ended by CR, LF or CRLF, as the SSE format has it: a CRLF
    split between two reads makes one empty line more, which ends no data); one longer than
    ``limit`` characters is a server gone wrong (a permanent error). Linear: a read's text is
    split once, and a line that spans reads is joined once."""
    pending: list[str] = []
    size = 0
    async for text in response.aiter_text():
        parts = _LINE_BREAK.split(text)
        if len(parts) > 1:
            head = parts[0]
            if size + len(head) > limit or any(len(part) > limit for part in parts[1:-1]):
                raise _line_too_long(response, limit)
            pending.append(head)
            yield "".join(pending)
            for line in parts[1:-1]:
                yield line
            pending, size = [], 0
        pending.append(parts[-1])
        size += len(parts[-1])
        if size > limit:
            raise _line_too_long(response, limit)
    if size:
        yield "".join(pending)


def _line_too_long(response: httpx.Response, limit: int) -> ProviderRequestError:
    return ProviderRequestError(
        f"the event stream sent a line of over {limit} characters", status=response.status_code
    )


def _secrets(base_url: str, api_key: str | None, headers: dict[str, str]) -> list[str]:
    """What a provider sends that must never be shown: its key, the credentials of its URL
    (as written, decoded, encoded as httpx sends them, and as Basic auth, which httpx sends in
    place of the key) and the values of credential-like headers of its config."""
    found: set[str] = set()
    if api_key:
        found.add(api_key)
    parts = urlsplit(base_url)
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        for raw in (user, password):
            found.update({raw, unquote(raw), quote(unquote(raw), safe="")})
        pair = f"{unquote(user)}:{unquote(password)}"
        found.add(base64.b64encode(pair.encode()).decode())
    for name, value in headers.items():
        lowered = name.lower()
        if "auth" in lowered or any(word in lowered for word in ("key", "token", "secret")):
            found.add(value)
            found.add(value.partition(" ")[2])  # (the credentials after "Bearer ", "Basic ")
    return sorted((s for s in found if len(s) >= 3), key=len, reverse=True)


def _choices(chunk: dict[str, Any]) -> list[tuple[str | None, str | None]]:
    """(delta text, finish reason) of each choice; StreamInterruptedError for a bad shape."""
    out = []
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            raise StreamInterruptedError(f"the stream sent a malformed choice: {choice!r}")
        delta = choice.get("delta") or {}
        text = delta.get("content") if isinstance(delta, dict) else None
        reason = choice.get("finish_reason")
        if (text is not None and not isinstance(text, str)) or (
            reason is not None and not isinstance(reason, str)
        ):
            raise StreamInterruptedError(f"the stream sent a malformed choice: {choice!r}")
        out.append((text, reason))
    return out


def _whole_answer(
    response: httpx.Response, request: GenerationRequest, body: bytes
) -> list[str | Usage]:
    """A non-streamed completion (its ``body``) read as one delta and its usage."""
    try:
        payload = json.loads(body)
    except ValueError:
        kind = response.headers.get("content-type", "no content type")
        raise ProviderRequestError(
            f"{response.status_code} from {response.request.url.host} is not an event stream"
            f" ({kind}): {body.decode(errors='replace')!r}",
            status=response.status_code,
        ) from None
    if isinstance(payload, dict) and payload.get("error"):
        raise _error_in_stream(payload["error"], request.model)
    try:
        choice = payload["choices"][0]
        text = choice["message"]["content"] or ""
        if not isinstance(text, str):
            raise TypeError
    except (KeyError, IndexError, TypeError):
        raise ProviderRequestError(
            f"the answer is neither an event stream nor a completion: {str(payload)!r}",
            status=response.status_code,
        ) from None
    usage = _usage(payload.get("usage"), request, text, choice.get("finish_reason"))
    return [text, usage] if text else [usage]


def _parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise StreamInterruptedError(
            f"the stream sent a chunk that is not JSON: {data!r}"
        ) from None
    if not isinstance(chunk, dict):
        raise StreamInterruptedError(f"the stream sent a chunk that is not an object: {data!r}")
    return chunk


def _usage(
    reported: dict[str, Any] | None, request: GenerationRequest, text: str, finish: str | None
) -> Usage:
    prompt = reported.get("prompt_tokens") if isinstance(reported, dict) else None
    completion = reported.get("completion_tokens") if isinstance(reported, dict) else None
    if _is_count(prompt) and _is_count(completion):
        return Usage(int(prompt or 0), int(completion or 0), finish)
    sent = "".join(m.content for m in request.as_messages())
    return Usage(estimate_tokens(sent), estimate_tokens(text), finish, estimated=True)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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


def error_from_response(response: httpx.Response, model: str, body: bytes) -> ProviderError:
    """The ProviderError for an HTTP error answer (``body``: as much of it as was read)."""
    try:
        payload: Any = json.loads(body)
    except ValueError:
        payload = body.decode(errors="replace")
    message, code = _message_of(payload)
    text = f"{response.status_code} from {response.request.url.host}: {message}"
    after = parse_retry_after(response.headers.get("retry-after"))
    return error_for_status(response.status_code, text, code, model, after)


def error_for_status(
    status: int, text: str, code: str, model: str, after: float | None = None
) -> ProviderError:
    """The ProviderError that an HTTP status (and the error's code/type words) stands for."""
    if 300 <= status < 400:
        return ProviderRequestError(f"{text} (a redirect: check base_url)", status=status)
    if status == 429 and _is_quota_error(code):
        return QuotaExhaustedError(text, status=status)
    if status == 429 or (status == 503 and after is not None):
        return RateLimitedError(text, status=status, after=after)
    if status >= 500 or status == 408:
        return ProviderUnavailableError(text, status=status)
    if status in (401, 403):
        return ProviderAuthError(text, status=status)
    if status == 404:
        return ModelNotFoundError(f"{text} (model {model!r})", status=status)
    if _is_context_error(text + " " + code):
        return ContextLengthExceededError(text, status=status)
    return ProviderRequestError(text, status=status)


def _error_in_stream(error: Any, model: str) -> ProviderError:
    """An error object sent inside the event stream (vLLM, llama.cpp do this)."""
    message, code = _message_of({"error": error})
    if _is_context_error(message + " " + code):
        return ContextLengthExceededError(message)
    status = error.get("code") if isinstance(error, dict) else None
    if isinstance(status, str) and status.isascii() and status.isdigit():
        status = int(status)  # ("code": "400", as some servers write it)
    if isinstance(status, int) and not isinstance(status, bool) and 300 <= status < 600:
        return error_for_status(status, f"the provider reported: {message}", code, model)
    if _is_quota_error(code):
        return QuotaExhaustedError(f"the provider reported: {message}")
    if "rate_limit" in code or "rate limit" in message.lower():
        return RateLimitedError(f"the provider reported: {message}")
    return StreamInterruptedError(f"the stream reported an error: {message}")


def _is_quota_error(code: str) -> bool:
    """A 429 whose code or type says the account's quota or budget is spent, not that it
    sent too fast (OpenAI: ``insufficient_quota``; older: ``billing_hard_limit_reached``)."""
    lowered = code.lower()
    return "insufficient_quota" in lowered or "billing_hard_limit" in lowered


def _is_context_error(text: str) -> bool:
    lowered = text.lower()
    return any(hint in lowered for hint in _CONTEXT_HINTS)
