"""Lifecycle hooks: subclass ``Hooks`` and override what you need; every default does nothing.

Metrics, tracing and webhooks plug in here rather than inside the worker loop. A hook that
raises is logged and ignored: it never changes a job's outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence

from .models import ErrorInfo, Job

log = logging.getLogger("backburner.hooks")


class Hooks:
    """No-op lifecycle callbacks. Each receives the job as it was stored by the transition."""

    async def on_enqueue(self, job: Job) -> None:
        """A new job was stored (not called for an idempotent repeat)."""

    async def on_start(self, job: Job) -> None:
        """A worker claimed the job and is about to run an attempt."""

    async def on_retry(self, job: Job, error: ErrorInfo) -> None:
        """An attempt failed and the job is queued again (``job.run_at`` is when)."""

    async def on_complete(self, job: Job) -> None:
        """The job completed."""

    async def on_fail(self, job: Job) -> None:
        """The job failed for good and is in the dead-letter queue."""

    async def on_cancel(self, job: Job) -> None:
        """The job was cancelled (called in the process that cancelled it)."""


class HookChain:
    """Calls several Hooks in order, isolating each one's failures."""

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self.hooks = list(hooks)

    async def enqueue(self, job: Job) -> None:
        for hook in tuple(self.hooks):  # a hook may be removed while this one awaits
            if _overrides(hook, "on_enqueue"):
                await _call(hook.on_enqueue(job), "on_enqueue")

    async def start(self, job: Job) -> None:
        for hook in tuple(self.hooks):  # a hook may be removed while this one awaits
            if _overrides(hook, "on_start"):
                await _call(hook.on_start(job), "on_start")

    async def retry(self, job: Job, error: ErrorInfo) -> None:
        for hook in tuple(self.hooks):  # a hook may be removed while this one awaits
            if _overrides(hook, "on_retry"):
                await _call(hook.on_retry(job, error), "on_retry")

    async def complete(self, job: Job) -> None:
        for hook in tuple(self.hooks):  # a hook may be removed while this one awaits
            if _overrides(hook, "on_complete"):
                await _call(hook.on_complete(job), "on_complete")

    async def fail(self, job: Job) -> None:
        for hook in tuple(self.hooks):  # a hook may be removed while this one awaits
            if _overrides(hook, "on_fail"):
                await _call(hook.on_fail(job), "on_fail")

    async def cancel(self, job: Job) -> None:
        for hook in tuple(self.hooks):  # a hook may be removed while this one awaits
            if _overrides(hook, "on_cancel"):
                await _call(hook.on_cancel(job), "on_cancel")


def _overrides(hook: Hooks, name: str) -> bool:
    """Whether ``hook`` has its own ``name``, on its class or the instance (the defaults do
    nothing: not worth a call, which every job pays)."""
    method = getattr(hook, name, None)
    if method is None:
        return False
    return getattr(method, "__func__", method) is not getattr(Hooks, name)


async def _call(call: Awaitable[None], name: str) -> None:
    try:
        await call
    except Exception:
        log.exception("hook %s raised; ignored", name)
