"""Built-in tasks the service offers: ``generate`` (POST /v1/generate)."""

from __future__ import annotations

import time
from typing import Any

from .app import Backburner
from .context import JobContext
from .errors import PermanentError
from .providers import SimulatedProvider

GENERATE = "generate"


def format_messages(messages: list[dict[str, Any]]) -> str:
    """Chat messages as one prompt text (the simulator has no chat template)."""
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages)


def install_builtin_tasks(bb: Backburner, provider: SimulatedProvider | None = None) -> None:
    """Register ``generate`` on ``bb`` unless it already has a task of that name."""
    if GENERATE in bb.tasks:
        return
    llm = provider or SimulatedProvider()

    @bb.task(name=GENERATE, max_attempts=3, timeout=600)
    async def generate(
        ctx: JobContext,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        model: str = "simulated",
        max_tokens: int = 256,
        temperature: float | None = None,
    ) -> dict[str, Any]:
        """Generate text, streaming each token as a ``token`` event."""
        if (prompt is None) == (messages is None):
            raise PermanentError("give exactly one of prompt or messages")
        text_in = prompt if prompt is not None else format_messages(messages or [])
        started = time.monotonic()
        first_token_s: float | None = None
        parts: list[str] = []
        async for delta in llm.stream(text_in, max_tokens=max_tokens):
            if first_token_s is None:
                first_token_s = time.monotonic() - started
            parts.append(delta)
            # The attempt lets a reader tell a retry's tokens (which start over) from the rest.
            await ctx.emit("token", {"text": delta, "attempt": ctx.attempt})
            if len(parts) % 8 == 0:
                await ctx.progress(100 * len(parts) / max_tokens, f"{len(parts)} tokens")
        elapsed = time.monotonic() - started
        ctx.add_usage(
            input_tokens=llm.count_tokens(text_in),
            output_tokens=len(parts),
            time_to_first_token_s=round(first_token_s or 0.0, 4),
            tokens_per_s=round(len(parts) / elapsed, 2) if elapsed > 0 else 0.0,
        )
        return {"text": "".join(parts), "model": model, "provider": llm.name, "simulated": True}
