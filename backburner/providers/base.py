"""The Provider Protocol: a model call as an async stream of text deltas, then its usage."""

from __future__ import annotations

import calendar
import contextlib
import email.utils
import re
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

ROLES = frozenset({"system", "user", "assistant", "tool"})
LONGEST_RETRY_AFTER_S = 3600.0
"""A provider's Retry-After is clamped to this: a header is no reason to park a job for days."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What one call asks of a model: chat ``messages`` or a raw ``prompt`` to continue."""

    model: str
    """The model's name at the provider (a route's ``upstream`` name)."""
    messages: tuple[Message, ...] = ()
    prompt: str | None = None
    max_tokens: int = 256
    temperature: float | None = None
    stop: tuple[str, ...] = ()

    def as_messages(self) -> tuple[Message, ...]:
        """The request in chat form (a raw prompt becomes one user message)."""
        if self.messages:
            return self.messages
        return (Message("user", self.prompt or ""),)


@dataclass(frozen=True, slots=True)
class Usage:
    """The last item of every stream: what the call consumed and why it stopped."""

    input_tokens: int
    output_tokens: int
    finish_reason: str | None = None
    """``stop`` (the model ended or met a stop sequence), ``length`` (max_tokens), ..."""
    estimated: bool = False
    """True when the provider reported no counts and these are estimates."""


class Provider(Protocol):
    """A model backend. ``stream`` yields text deltas (``str``), then exactly one ``Usage``.

    Cancelling the consuming task closes the upstream call at once (the provider stops
    spending); deltas already yielded stay with the caller. Failures raise
    ``backburner.errors.ProviderError`` subclasses, whose class says whether to retry.
    """

    kind: str
    """``openai``, ``local`` or ``simulated``: what the job's usage and result report."""

    def stream(self, request: GenerationRequest) -> AsyncGenerator[str | Usage, None]: ...

    async def aclose(self) -> None:
        """Release connections, threads and models. The provider is unusable after."""


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token) for providers that report none."""
    return (len(text) + 3) // 4


def messages_from(raw: Sequence[Mapping[str, object]]) -> tuple[Message, ...]:
    """Chat messages from JSON-like dicts (``role`` and ``content`` strings)."""
    out = []
    for item in raw:
        role, content = item.get("role", "user"), item.get("content", "")
        if not isinstance(role, str) or role not in ROLES or not isinstance(content, str):
            raise ValueError(f"a message needs a role in {sorted(ROLES)} and a string content")
        out.append(Message(role, content))
    return tuple(out)


def generation_args(
    prompt: object, messages: object, max_tokens: object, temperature: object, stop: object
) -> tuple[tuple[Message, ...], tuple[str, ...]]:
    """A generation's arguments checked (ValueError says which is wrong): its chat messages
    (none for a prompt) and its stop sequences (one string is one sequence)."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("prompt must be a string")
    if messages is not None and not (
        isinstance(messages, list | tuple) and all(isinstance(m, Mapping) for m in messages)
    ):
        raise ValueError("messages must be a list of objects")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if temperature is not None and not (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and 0.0 <= temperature <= 2.0
    ):
        raise ValueError(f"temperature must be from 0 to 2, got {temperature!r}")
    sequences = (stop,) if isinstance(stop, str) else stop
    if not isinstance(sequences, Sequence) or not all(isinstance(s, str) and s for s in sequences):
        raise ValueError(f"stop must be strings that are not empty, got {stop!r}")
    chat = messages_from(messages) if messages is not None else ()
    return chat, tuple(sequences)


def parse_retry_after(
    value: str | None, *, now: float | None = None, longest: float = LONGEST_RETRY_AFTER_S
) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date (RFC 9110,
    any of its three date forms), at most ``longest``. Anything else (``inf``, ``1_0``,
    ``0x10``) is None."""
    if value is None:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        seconds = float(text)
    else:
        when = _http_date(text)
        if when is None:
            return None
        seconds = when - (time.time() if now is None else now)
    return min(longest, max(0.0, seconds))


_DELAY_SECONDS = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
"""Whole seconds as RFC 9110 writes them; a fraction, and a sign (read as 0), let through."""


def _http_date(text: str) -> float | None:
    """The Unix time of an HTTP date: IMF-fixdate, RFC 850's, or C's asctime (always GMT)."""
    with contextlib.suppress(ValueError):  # asctime, "Sun Nov  6 08:49:37 1994": no zone
        return float(calendar.timegm(time.strptime(text, "%a %b %d %H:%M:%S %Y")))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # a date with "-0000" or no zone: not an HTTP date
        return None
    return when.timestamp()
