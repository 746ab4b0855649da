"""A generation's deltas on their way to the job's events, without holding up the stream.

One write per generation is in flight at a time; deltas that arrive meanwhile gather and go
in the next ``token`` event. With a fast store every delta is its own event, at once; with a
loaded one (thousands of generations in one process) events carry several deltas, so the
store's write rate never slows the models down.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..context import JobContext

PROGRESS_EVERY = 8
"""Tokens between two progress updates of a generation."""


class TokenEvents:
    """Appends ``token`` events ``{"text", "tokens", "attempt", "model"}`` and progress."""

    def __init__(self, ctx: JobContext, model: str, max_tokens: int) -> None:
        self._ctx = ctx
        self._model = model
        self._max_tokens = max_tokens
        self._pending: list[str] = []
        self._written = 0
        self._writer: asyncio.Task[None] | None = None

    def add(self, delta: str) -> None:
        """Queue ``delta``; raises what a previous write raised (LeaseLostError, ...)."""
        writer = self._writer
        if writer is not None and writer.done():
            writer.result()
            writer = None
        self._pending.append(delta)
        if writer is None:
            self._writer = asyncio.create_task(self._write())

    async def _write(self) -> None:
        ctx = self._ctx
        while self._pending:
            deltas, self._pending = self._pending, []
            before = self._written
            self._written += len(deltas)
            data = {
                "text": "".join(deltas),
                "tokens": len(deltas),
                "attempt": ctx.attempt,
                "model": self._model,
            }
            await ctx.emit("token", data)
            if self._written // PROGRESS_EVERY > before // PROGRESS_EVERY:
                done = min(100.0, 100 * self._written / self._max_tokens)
                await ctx.progress(done, f"{self._written} tokens")

    async def flush(self) -> None:
        """Write what is pending, and wait for it (raising what the writes raised)."""
        if self._writer is not None:
            await self._writer
            self._writer = None

    def abandon(self) -> None:
        """Stop writing (the job was cancelled or lost: nothing more may be written)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if writer.done():
            if not writer.cancelled():
                writer.exception()  # read, so asyncio does not log it as never retrieved
        else:
            writer.cancel()
            writer.add_done_callback(_read_outcome)


def _read_outcome(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
