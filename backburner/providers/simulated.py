"""A simulated LLM: deterministic text at a set pace, and failures on demand. Not a model.

For tests, demos and benchmarks. Its results say ``"simulated": true``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal

from ..errors import (
    ContextLengthExceededError,
    ProviderUnavailableError,
    RateLimitedError,
    StreamInterruptedError,
)
from .base import GenerationRequest, Usage

_TEXT = (
    "the answer depends on the question and on what the context says about it so this "
    "simulated model writes plausible filler one token at a time until it reaches its limit"
)
_WORDS = tuple(_TEXT.split(" "))

Failure = Literal["rate_limit", "server_error", "timeout", "context_overflow", "cut_stream"]
FAILURES: tuple[Failure, ...] = (
    "rate_limit",
    "server_error",
    "timeout",
    "context_overflow",
    "cut_stream",
)


@dataclass(slots=True)
class SimulatedProvider:
    """Streams made-up words; the same prompt always gives the same text.

    ``fail`` injects a failure into the first ``fail_times`` calls (every call if None):
    ``rate_limit`` (429 with ``retry_after_s``), ``server_error`` (500), ``timeout`` (no first
    token within ``timeout_s``), ``context_overflow`` (prompt longer than ``context_tokens``
    words fails the same way without ``fail``), ``cut_stream`` (stops after half the tokens).
    """

    kind = "simulated"
    time_to_first_token_s: float = 0.05
    tokens_per_s: float = 50.0
    fail: Failure | None = None
    fail_times: int | None = None
    retry_after_s: float = 1.0
    timeout_s: float = 1.0
    context_tokens: int = 8192
    calls: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.fail is not None and self.fail not in FAILURES:
            raise ValueError(f"fail must be one of {list(FAILURES)}, got {self.fail!r}")
        if self.tokens_per_s <= 0 or self.time_to_first_token_s < 0:
            raise ValueError("tokens_per_s must be > 0 and time_to_first_token_s >= 0")

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def aclose(self) -> None:
        return None

    def _failure_now(self) -> Failure | None:
        self.calls += 1
        if self.fail is None or (self.fail_times is not None and self.calls > self.fail_times):
            return None
        return self.fail

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[str | Usage, None]:
        """Yield up to ``max_tokens`` words (each with its leading space), then the usage."""
        text_in = "\n".join(m.content for m in request.as_messages())
        input_tokens = self.count_tokens(text_in)
        failure = self._failure_now()
        if failure == "context_overflow" or input_tokens + request.max_tokens > self.context_tokens:
            raise ContextLengthExceededError(
                f"simulated: {input_tokens} prompt + {request.max_tokens} new tokens exceed the "
                f"context of {self.context_tokens}",
                status=400,
            )
        if failure == "rate_limit":
            raise RateLimitedError(
                "simulated: 429 Too Many Requests", status=429, after=self.retry_after_s
            )
        if failure == "server_error":
            raise ProviderUnavailableError("simulated: 500 Internal Server Error", status=500)
        if failure == "timeout":
            await asyncio.sleep(self.timeout_s)
            raise ProviderUnavailableError(f"simulated: no first token within {self.timeout_s:g} s")
        seed = int.from_bytes(hashlib.sha256(text_in.encode()).digest()[:4], "big")
        cut_at = request.max_tokens // 2 if failure == "cut_stream" else None
        await asyncio.sleep(self.time_to_first_token_s)
        for i in range(request.max_tokens):
            if i == cut_at:
                raise StreamInterruptedError(f"simulated: the stream broke after {i} tokens")
            if i:
                await asyncio.sleep(1 / self.tokens_per_s)
            word = _WORDS[(seed + i * 7) % len(_WORDS)]
            yield word if i == 0 else " " + word
        yield Usage(input_tokens, request.max_tokens, "length")
