"""What a running handler sees of its job: ``ctx`` and the ``current_job()`` ContextVar."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .errors import BackendConnectionError, ConfigurationError, InvalidInputError
from .jsoncodec import is_unicode, round_trip
from .models import Job, Progress
from .observability.tracing import Tracing

if TYPE_CHECKING:
    from .backends.base import Backend
    from .clock import Clock
    from .providers.job_llm import JobLLM, LimitSettings
    from .providers.routing import ModelRouter

RESERVED_EVENT_TYPES = frozenset(
    {"status", "attempt_failed", "progress", "step", "spawned", "rerun"}
)
"""Event types only the engine writes (``step``/``spawned``/``rerun``: a pipeline's records)."""

RIDE_OUT_S = 30.0
"""How long an event write rides out a backend outage by default (the default lease: past it
the job is another worker's)."""

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
        "_last_seq",
        "_limits",
        "_llm",
        "_models",
        "_on_webhook",
        "_ride_out_s",
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
        ride_out_s: float = RIDE_OUT_S,
    ) -> None:
        """``ride_out_s``: how long an event write waits out a backend outage (the lease)."""
        self.job = job
        self._ride_out_s = ride_out_s
        self._last_seq = 0
        """The seq of this context's last event write known to have landed."""
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
        seq = await self.record(
            "progress", {"percent": progress.percent, "message": message}, progress=progress
        )
        job = self.job
        if job.webhook_progress and job.webhook_url is not None:
            try:
                queued = await self._backend.add_progress_webhook(
                    self.job_id, self.fence, now=self._clock.now()
                )
            except BackendConnectionError:
                return seq  # (the latest progress is what one sends: the next one will do)
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
        return await self.record(type, data)

    async def record(self, type: str, data: Any, *, progress: Progress | None = None) -> int:
        """Append an event of any type, the engine's own included (``emit`` checks a handler's
        type first); its seq. A backend outage is waited out for as long as the lease may
        hold (then BackendConnectionError): the job's attempt is not failed by a Redis restart.
        A write whose connection broke may have landed: it is looked for among the events
        since this context's last one before it is made again, so none is written twice."""
        now = self._clock.now()
        give_up = time.monotonic() + self._ride_out_s
        delay = 0.05
        lost = False
        while True:
            try:
                landed = await self._landed(type, data, now) if lost else None
                seq = landed or await self._backend.append_event(
                    self.job_id, self.fence, type, data, now=now, progress=progress
                )
            except BackendConnectionError:
                if time.monotonic() + delay > give_up:
                    raise
                lost = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self._last_seq = max(self._last_seq, seq)
            return seq

    async def _landed(self, type: str, data: Any, at: float) -> int | None:
        """The seq of the event (type, data, at) if it is in the log after this context's last
        one: a write that landed though its reply was lost."""
        expected = round_trip(data, "event data")
        after = self._last_seq
        while True:
            events = await self._backend.events(self.job_id, after=after, limit=1000)
            for event in events:
                if event.type == type and event.at == at and event.data == expected:
                    return event.seq
            if len(events) < 1000:
                return None
            after = events[-1].seq

    def add_usage(self, *, input_tokens: int = 0, output_tokens: int = 0, **extra: Any) -> None:
        """Accumulate token usage; stored in the job's ``usage`` when it completes."""
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInputError(f"{name} must be an integer >= 0, got {value!r}")
        self.usage["input_tokens"] = self.usage.get("input_tokens", 0) + input_tokens
        self.usage["output_tokens"] = self.usage.get("output_tokens", 0) + output_tokens
        self.usage.update(extra)
