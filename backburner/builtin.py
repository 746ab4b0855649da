"""Built-in tasks the service offers: ``generate`` (POST /v1/generate) and the ``batch``
pipeline (POST /v1/batches: one ``generate`` child per request)."""

from __future__ import annotations

from typing import Any

from .app import Backburner
from .context import JobContext
from .models import JobStatus
from .pipelines import PipelineContext

GENERATE = "generate"
BATCH = "batch"
BATCH_STEP = "requests"
"""The name of the batch pipeline's one ``map``: its children are the batch's requests."""


DEFAULT_MAX_TOKENS = 256
"""A generate job's max_tokens when its input names none."""


def install_builtin_tasks(bb: Backburner) -> None:
    """Register ``generate`` and ``batch`` on ``bb`` unless it has tasks of those names, and
    ``research`` over ``settings.research_folder`` when that is set."""
    if GENERATE not in bb.tasks:
        _install_generate(bb)
    if BATCH not in bb.tasks:
        _install_batch(bb)
    if bb.settings.research_folder is not None and "research" not in bb.tasks:
        from .research import install_research  # its BM25 library is an optional extra

        install_research(bb, folder=bb.settings.research_folder)


def _install_generate(bb: Backburner) -> None:
    @bb.task(name=GENERATE, max_attempts=3, timeout=600)
    async def generate(
        ctx: JobContext,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        model: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
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

    generate.__backburner_builtin__ = True  # type: ignore[attr-defined]  # see is_builtin


def _install_batch(bb: Backburner) -> None:
    async def batch(ctx: PipelineContext, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """Run each request (``{custom_id, prompt | messages, model, ...}``, checked by the
        API) as a ``generate`` child with its custom_id in the child's metadata, at the
        batch's priority. A failed request does not fail the batch: it ends when all did."""
        inputs = [{k: v for k, v in r.items() if k != "custom_id"} for r in requests]
        await ctx.map(
            BATCH_STEP,
            GENERATE,
            inputs,
            partial=True,
            metadata=[{"custom_id": r["custom_id"]} for r in requests],
            priority=ctx.job.priority,
        )
        return {"request_counts": await count_children(bb, ctx.job_id), "total": len(requests)}

    batch.__backburner_builtin__ = True  # type: ignore[attr-defined]  # see has_builtin_batch
    bb.pipeline(name=BATCH, max_attempts=3, timeout=3600)(batch)


def is_builtin(bb: Backburner, name: str) -> bool:
    """True if ``bb``'s task ``name`` is this module's (an application may have a task of its
    own by that name: then its input is its own business)."""
    definition = bb.tasks.get(name)
    return definition is not None and getattr(definition.handler, "__backburner_builtin__", False)


def has_builtin_batch(bb: Backburner) -> bool:
    """True if ``bb``'s ``batch`` task is this module's pipeline (an application's own task of
    that name has no batch API)."""
    return is_builtin(bb, BATCH)


async def count_children(bb: Backburner, parent_id: str) -> dict[str, int]:
    """How many of a job's children are in each status (every status, zeros too)."""
    counts = {status.value: 0 for status in JobStatus}
    cursor: str | None = None
    while True:
        page = await bb.list(parent_id=parent_id, limit=1000, cursor=cursor)
        for child in page.jobs:
            counts[child.status.value] += 1
        if page.next_cursor is None:
            return counts
        cursor = page.next_cursor
