"""Durable multi-step pipelines: checkpointed steps and child jobs (docs/pipelines.md)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import PipelineDefinitionError
from ..hooks import Hooks
from ..models import Job, JobStatus
from .context import (
    PARTIAL_KEY_END,
    PIPELINE_EVENTS,
    RERUN_EVENT,
    PipelineContext,
    Recorded,
    StepRetry,
)

WAKE_RETRIES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 0.0)
"""The pauses while a failed child's parent is still running (3 s in all; the last look
needs no pause after it)."""

if TYPE_CHECKING:
    from ..app import Backburner
    from ..context import JobContext

__all__ = [
    "ParentWaker",
    "PipelineContext",
    "StepRetry",
    "cancel_children",
    "pipeline_handler",
    "run_pipeline",
]


async def _recorded(ctx: JobContext) -> Recorded:
    """The pipeline's ``step`` and ``spawned`` events so far, in order: (kind, (name, value,
    (within, at) or None)); and, if it was ever replayed, the children each map ran again
    since its last replay (``rerun`` events)."""
    recorded = Recorded()
    after = 0
    while True:
        events = await ctx.backend.events(ctx.job_id, after=after, limit=1000)
        for event in events:
            if not isinstance(event.data, dict):
                continue
            if event.type in PIPELINE_EVENTS:
                value = event.data.get("result" if event.type == "step" else "children")
                name, within, at = (event.data.get(k) for k in ("name", "within", "at"))
                # (where it began, if its release wrote that down: see PipelineContext)
                placed = (
                    (within, at) if isinstance(at, int) and isinstance(within, str | None) else None
                )
                if isinstance(name, str):
                    recorded.steps.append((event.type, (name, value, placed)))
            elif event.type == "status" and event.data.get("replayed") is True:
                recorded.rerun = {}
            elif event.type == RERUN_EVENT and recorded.rerun is not None:
                name, children = event.data.get("name"), event.data.get("children")
                if isinstance(name, str) and isinstance(children, list):
                    ran = recorded.rerun.setdefault(name, set())
                    ran.update(child for child in children if isinstance(child, str))
        if len(events) < 1000:
            return recorded
        after = events[-1].seq


async def run_pipeline(
    app: Backburner,
    fn: Callable[..., Awaitable[Any]],
    ctx: JobContext,
    kwargs: dict[str, Any],
) -> Any:
    """One run of a pipeline: load what earlier runs stored, then run its code from the top."""
    recorded = await _recorded(ctx)
    pctx = PipelineContext(ctx, app, recorded.steps, rerun=recorded.rerun)
    result = await fn(pctx, **kwargs)
    if pctx.parked is not None:  # the Suspend was caught: the result was made without it
        raise PipelineDefinitionError(
            f"the pipeline returned after this run parked ({pctx.parked}): an except clause"
            " caught the wait of ctx.map or ctx.spawn (Suspend); let it propagate"
        )
    return result


def pipeline_handler(
    app: Backburner, fn: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[Any]]:
    """The task handler that runs ``fn`` as a pipeline (its signature is ``fn``'s)."""

    @functools.wraps(fn)
    async def run(ctx: JobContext, **kwargs: Any) -> Any:
        return await run_pipeline(app, fn, ctx, kwargs)

    return run


_CANCELLING_CHILDREN_OF: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "backburner_cancelling_children_of", default=None
)
"""The parent whose cancel_children runs in this context: its children's cancels need not
wake it (it is the one running, or ending)."""


async def cancel_children(app: Backburner, parent_id: str, *, while_failed: bool = False) -> None:
    """Cancel every child of a cancelled job that is still queued or running (and theirs).

    A page of children is cancelled at once: one by one, a batch of 6,000 took 11 s on Redis
    and 19 s on SQLite, inside the request that cancelled it. ``while_failed``: the cascade of
    the parent's failure, which stops before a page once the parent is no longer failed (a
    replay runs it again, and its run again the children that had failed or been cancelled:
    those must not be cancelled by the cascade of its earlier failure)."""
    if not await app.backend.has_open_children(parent_id):  # (most jobs: one read, not two)
        return
    # Running children first: they are the ones spending (a batch's 50 running requests went
    # on streaming tokens for 6 s while its 9,950 queued ones were cancelled first). Those
    # that start meanwhile are found by the last pass (or cancel themselves as they start:
    # their parent has ended).
    open_statuses = (JobStatus.PROCESSING, JobStatus.QUEUED, JobStatus.PROCESSING)
    cascade = _CANCELLING_CHILDREN_OF.set(parent_id)  # (the gather's tasks take a copy of it)
    try:
        for status in open_statuses:
            while True:
                if while_failed and await app.backend.job_status(parent_id) != JobStatus.FAILED:
                    return
                page = await app.backend.list_jobs(parent_id=parent_id, status=status, limit=500)
                if not page.jobs:
                    break
                cancels = (app.cancel(child.task_id) for child in page.jobs)
                for outcome in await asyncio.gather(*cancels, return_exceptions=True):
                    if isinstance(outcome, BaseException):
                        raise outcome  # (as one by one: the caller hears of the first failure)
    finally:
        _CANCELLING_CHILDREN_OF.reset(cascade)


class ParentWaker(Hooks):
    """When a child job ends and its parent has no other child queued or running, the parent
    is due at once (it parked until then, or until its next poll). A child that starts after
    its parent ended is cancelled (the parent's cancel may have run before it existed), and a
    parent that fails takes its open children with it."""

    def __init__(self, app: Backburner) -> None:
        self.app = app

    async def _ended(self, job: Job, *, failed: bool = False) -> None:
        parent = job.parent_id
        if parent is None:
            return
        backend = self.app.backend
        if failed and not (job.idempotency_key or "").endswith(PARTIAL_KEY_END):
            # At once, not at its next poll: it fails now, and its siblings' work stops. (A
            # partial map's child's failure is one of its results: no one waits on it.)
            await self._wake_when_parked(parent)
            return
        if not await backend.has_open_children(parent):
            await backend.wake(parent, now=self.app.clock.now())

    async def _wake_when_parked(self, parent: str) -> None:
        """Wake ``parent`` now; if it is still running, again once it has parked: between
        its look at its children and its wait's write, a wake does nothing, and it would wait
        for its next poll (minutes, for a wide fan-out) to see the failure. A parent that runs
        on for longer (a step) sees it when it looks at its children next."""
        backend, clock = self.app.backend, self.app.clock
        for pause in WAKE_RETRIES_S:
            status = await backend.job_status(parent)
            if status is None or status.is_terminal:
                return
            if status is JobStatus.QUEUED:
                await backend.wake(parent, now=clock.now())
                return
            await asyncio.sleep(pause)

    async def on_start(self, job: Job) -> None:
        if job.parent_id is None:
            return
        # Its status alone: a batch's record holds all its requests' inputs, and each of its
        # 10,000 requests asks as it starts.
        status = await self.app.backend.job_status(job.parent_id)
        if status is None or status.is_terminal:
            await self.app.cancel(job.task_id)

    async def on_complete(self, job: Job) -> None:
        await self._ended(job)

    async def on_fail(self, job: Job) -> None:
        await self._ended(job, failed=True)
        await cancel_children(self.app, job.task_id, while_failed=True)

    async def on_cancel(self, job: Job) -> None:
        cascade = job.parent_id is not None and _CANCELLING_CHILDREN_OF.get() == job.parent_id
        await self._ended(job, failed=not cascade)
