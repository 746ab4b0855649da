"""Demo tasks for ``backburner demo``: a simulated LLM call, a flaky call, a broken call.

Nothing here calls a real model: ``simulated_summary`` streams made-up tokens on a timer so the
demo shows progress, token events, retries and the dead-letter queue without any setup.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .app import Backburner
from .context import JobContext
from .errors import PermanentError, Retry
from .settings import Settings

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "reads",
    "a",
    "long",
    "report",
    "and",
    "writes",
    "a",
    "short",
    "summary",
    "of",
    "it",
]


def make_demo_app(backend_url: str, settings: Settings | None = None) -> Backburner:
    """A Backburner with three demo tasks registered."""
    bb = Backburner(backend_url, settings=settings)

    @bb.task(max_attempts=3, timeout=60)
    async def simulated_summary(ctx: JobContext, text: str, tokens: int = 12) -> dict[str, Any]:
        """Pretends to be an LLM: emits one token event every 50 ms (a simulator, not a model)."""
        out: list[str] = []
        for i in range(tokens):
            await asyncio.sleep(0.05)
            word = WORDS[i % len(WORDS)]
            out.append(word)
            await ctx.emit("token", {"text": word})
            await ctx.progress(100 * (i + 1) / tokens, f"{i + 1}/{tokens} tokens")
        ctx.add_usage(input_tokens=len(text.split()), output_tokens=tokens)
        return {"summary": " ".join(out), "simulated": True}

    @bb.task(max_attempts=3)
    async def flaky_call(ctx: JobContext, fail_times: int = 1) -> dict[str, Any]:
        """Fails like a rate-limited API (Retry after 0.2 s) before it succeeds."""
        if ctx.attempt <= fail_times:
            raise Retry("simulated 429 Too Many Requests", after=0.2)
        return {"ok_on_attempt": ctx.attempt}

    @bb.task(max_attempts=2)
    async def broken_call(ctx: JobContext) -> None:
        """Always fails permanently: ends in the dead-letter queue."""
        raise PermanentError("simulated 400: context length exceeded")

    return bb
