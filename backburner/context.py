"""What a running handler sees of its job: ``ctx`` and the ``current_job()`` ContextVar."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError, InvalidInputError
from .jsoncodec import is_unicode
from .models import Job, Progress
from .observability.tracing import Tracing

if TYPE_CHECKING:
    from .backends.base import Backend
    from .clock import Clock
    from .providers.job_llm import JobLLM, LimitSettings
    from .providers.routing import ModelRouter

RESERVED_EVENT_TYPES = frozenset({"status", "attempt_failed", "progress", "step", "spawned"})
"""Event types only the engine writes (``step``/``spawned``: a pipeline's stored results)."""

_current: ContextVar[JobContext] = ContextVar("backburner_current_job")


def current_job() -> JobContext:
    """The context of the job running in this asyncio task; LookupError outside a job."""
    return _current.get()


def activate(ctx: JobContext) -> None:
    """Make ``ctx`` the current job of this asyncio task (the worker calls it)."""
    _current.set(ctx)


MAX_EVENT_TYPE_CHARS = 200
"""The longest event type ``ctx.emit`` takes."""


class JobContext:
    """Handed to every handler as its first argument. Writes are fenced by the attempt."""

    __slots__ = (
        "_backend",
        "_clock",
        "_limits",
        "_llm",
        "_models",
        "_on_webhook",
        "job",
        "tracing",
        "usage",
    )

    def __init__(
        self,
        job: Job,
        backend: Backend,
        clock: Clock,
        *,
        models: ModelRouter | None = None,
        limits: LimitSettings | None = None,
        on_webhook: Callable[[], None] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.job = job
        self.usage: dict[str, Any] = {}
        self._backend = backend
        self._clock = clock
        self._models = models
        self._limits = limits
        self._llm: JobLLM | None = None
        self._on_webhook = on_webhook
        self.tracing = tracing or Tracing()

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def llm(self) -> JobLLM:
        """Model calls for this job: ``await ctx.llm.generate(prompt, model=...)``."""
        if self._llm is None:
            if self._models is None:
                raise ConfigurationError("this job context has no model router")
            from .providers.job_llm import JobLLM, LimitSettings

            self._llm = JobLLM(self, self._models, self._limits or LimitSettings())
        return self._llm

    @property
    def job_id(self) -> str:
        return self.job.task_id

    @property
    def attempt(self) -> int:
        """1 for the first attempt; grows with each retry."""
        return self.job.attempts

    @property
    def fence(self) -> int:
        return self.job.fence

    async def progress(self, percent: float, message: str | None = None) -> int:
        """Record progress (0-100) and append a ``progress`` event; returns its seq."""
        if isinstance(percent, bool) or not isinstance(percent, int | float):
            raise InvalidInputError("progress percent must be a number")
        if not math.isfinite(percent) or not 0 <= percent <= 100:
            raise InvalidInputError(f"progress percent must be within 0..100, got {percent}")
        if message is not None and not isinstance(message, str):
            raise InvalidInputError("progress message must be a string (or None)")
        progress = Progress(percent=float(percent), message=message)
        seq = await self._backend.append_event(
            self.job_id,
            self.fence,
            "progress",
            {"percent": progress.percent, "message": message},
            now=self._clock.now(),
            progress=progress,
        )
        job = self.job
        if job.webhook_progress and job.webhook_url is not None:
            queued = await self._backend.add_progress_webhook(
                self.job_id, self.fence, now=self._clock.now()
            )
            if queued and self._on_webhook is not None:
                self._on_webhook()
        return seq

    async def emit(self, type: str, data: Any = None) -> int:
        """Append a custom event (token deltas, tool calls, ...); returns its seq.

        Raises LeaseLostError once the job was cancelled or taken over.
        """
        if (
            not isinstance(type, str)
            or not type
            or len(type) > MAX_EVENT_TYPE_CHARS
            or type in RESERVED_EVENT_TYPES
            or not is_unicode(type)
            or not type.isprintable()
        ):
            # (Printable: a line break would end the SSE field it is written in, and what
            # follows would read as events of its own.)
            raise InvalidInputError(
                f"event type must be a non-empty string of at most {MAX_EVENT_TYPE_CHARS}"
                f" printable characters (Unicode), other than {sorted(RESERVED_EVENT_TYPES)}"
            )
        return await self._backend.append_event(
            self.job_id, self.fence, type, data, now=self._clock.now()
        )

    def add_usage(self, *, input_tokens: int = 0, output_tokens: int = 0, **extra: Any) -> None:
        """Accumulate token usage; stored in the job's ``usage`` when it completes."""
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInputError(f"{name} must be an integer >= 0, got {value!r}")
        self.usage["input_tokens"] = self.usage.get("input_tokens", 0) + input_tokens
        self.usage["output_tokens"] = self.usage.get("output_tokens", 0) + output_tokens
        self.usage.update(extra)
