"""The retry policy: how an attempt's exception becomes the job's next state."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from ..backends.base import Fail, Outcome, RetryAt
from ..errors import InvalidResultError, PermanentError, ProviderError, Retry
from ..jsoncodec import valid_unicode
from ..models import ErrorInfo, Job
from ..tasks import TaskDefinition


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter and a cap; ``Retry(after=...)`` overrides it."""

    base_s: float = 1.0
    cap_s: float = 300.0
    dead_letter_ttl_s: float = 7 * 86400.0

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Delay before the retry that follows failed attempt ``attempt`` (1-based).

        Uniform in [0, min(cap, base * 2**(attempt-1))] ("full jitter"), so a burst of
        failures does not come back as a burst.
        """
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(attempt - 1, 62))
        return (rng or random).uniform(0.0, ceiling)

    def classify(
        self, exc: BaseException, task: TaskDefinition | None
    ) -> tuple[ErrorInfo, float | None]:
        """The error record for ``exc`` and the delay it asks for (None: use backoff)."""
        if isinstance(exc, ProviderError):
            return _error(exc.code, str(exc), exc.retryable), exc.after
        if isinstance(exc, Retry):
            return _error("retry", str(exc), True), exc.after
        if isinstance(exc, InvalidResultError):
            return _error("invalid_result", str(exc), False), None
        if isinstance(exc, PermanentError):
            return _error(_name(exc), str(exc), False), None
        if isinstance(exc, TimeoutError):
            return _error("timeout", str(exc) or "the attempt timed out", True), None
        if isinstance(exc, asyncio.CancelledError):  # raised by the handler: interrupted
            message = str(exc) or "the handler raised CancelledError"
            return _error("CancelledError", message, True), None
        retryable = True
        if task is not None:
            retryable = isinstance(exc, task.retry_on) and not isinstance(exc, task.permanent_on)
        return _error(_name(exc), str(exc) or repr(exc), retryable), None

    def after_failure(
        self, job: Job, error: ErrorInfo, delay: float | None, *, now: float
    ) -> Outcome:
        """Retry the job (RetryAt) or fail it into the DLQ (Fail), by budget and deadline."""
        ttl_s = max(job.ttl_s, self.dead_letter_ttl_s)
        if not error.retryable:
            return Fail(error, ttl_s)
        if job.attempts >= job.max_attempts:
            exhausted = ErrorInfo(
                type=error.type,
                message=f"{error.message} (gave up after {job.attempts} attempts)",
                retryable=True,
            )
            return Fail(exhausted, ttl_s)
        run_at = now + (self.backoff(job.attempts) if delay is None else delay)
        if job.deadline_at is not None and run_at >= job.deadline_at:
            late = ErrorInfo(
                type="deadline_exceeded",
                message=f"{error.message} (the retry would start after the job's deadline)",
                retryable=False,
            )
            return Fail(late, ttl_s)
        return RetryAt(error, run_at)


def _error(type: str, message: str, retryable: bool) -> ErrorInfo:
    # (an exception's text is whatever the handler made it: one holding a lone surrogate
    # could not be stored, and the job would fail with no error recorded)
    return ErrorInfo(type=valid_unicode(type), message=valid_unicode(message), retryable=retryable)


def _name(exc: BaseException) -> str:
    return type(exc).__name__
