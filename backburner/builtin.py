"""Built-in tasks the service offers: ``generate`` (POST /v1/generate)."""

from __future__ import annotations

from typing import Any

from .app import Backburner
from .context import JobContext

GENERATE = "generate"


def prompt_chars(prompt: str | None, messages: list[dict[str, Any]] | None) -> int:
    """How long a request's text is, for the API's prompt-size limit."""
    if prompt is not None:
        return len(prompt)
    return sum(len(str(m.get("content", ""))) for m in messages or [])


def install_builtin_tasks(bb: Backburner) -> None:
    """Register ``generate`` on ``bb`` unless it already has a task of that name."""
    if GENERATE in bb.tasks:
        return

    @bb.task(name=GENERATE, max_attempts=3, timeout=600)
    async def generate(
        ctx: JobContext,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        model: str | None = None,
        max_tokens: int = 256,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> dict[str, Any]:
        """Generate text with a routed model, streaming each delta as a ``token`` event."""
        result = await ctx.llm.generate(
            prompt,
            messages=messages,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop or (),
        )
        return {
            "text": result.text,
            "model": result.model,
            "provider": result.provider,
            "finish_reason": result.usage.finish_reason,
            "simulated": result.simulated,
        }
