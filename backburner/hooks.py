"""Lifecycle hooks: subclass ``Hooks`` and override what you need; every default does nothing.

Metrics, tracing and webhooks plug in here rather than inside the worker loop. A hook that
raises is logged and ignored: it never changes a job's outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

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
    """Calls several Hooks in order, isolating each one's failures.

    ``hooks`` is the list to change to add or remove one; the chain looks up which hooks have
    their own method for each lifecycle event once, and again whenever that list changes.
    """

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self.hooks = list(hooks)
        self._seen: list[Hooks] = []
        self._calls: dict[str, tuple[Callable[..., Awaitable[None]], ...]] = {}

    def _methods(self, name: str) -> tuple[Callable[..., Awaitable[None]], ...]:
        """The ``name`` methods of the hooks that override it, in order (cached: every job pays
        for this lookup several times)."""
        if self.hooks != self._seen:
            self._seen = list(self.hooks)
            self._calls = {}
        calls = self._calls.get(name)
        if calls is None:
            calls = tuple(getattr(h, name) for h in self._seen if _overrides(h, name))
            self._calls[name] = calls
        return calls

    def enqueue(self, job: Job) -> Coroutine[Any, Any, None]:
        return self._emit("on_enqueue", job)

    def start(self, job: Job) -> Coroutine[Any, Any, None]:
        return self._emit("on_start", job)

    def retry(self, job: Job, error: ErrorInfo) -> Coroutine[Any, Any, None]:
        return self._emit("on_retry", job, error)

    def complete(self, job: Job) -> Coroutine[Any, Any, None]:
        return self._emit("on_complete", job)

    def fail(self, job: Job) -> Coroutine[Any, Any, None]:
        return self._emit("on_fail", job)

    def cancel(self, job: Job) -> Coroutine[Any, Any, None]:
        return self._emit("on_cancel", job)

    async def _emit(self, name: str, *args: Any) -> None:
        for call in self._methods(name):
            try:
                await call(*args)
            except Exception:
                log.exception("hook %s raised; ignored", name)


def _overrides(hook: Hooks, name: str) -> bool:
    """Whether ``hook`` has its own ``name``, on its class or the instance (the defaults do
    nothing: not worth a call, which every job pays)."""
    method = getattr(hook, name, None)
    if method is None:
        return False
    return getattr(method, "__func__", method) is not getattr(Hooks, name)
