"""When the client repeats a request, how often it polls, and how soon a stream reconnects.

Pure functions of numbers, shared by the sync and async clients (and tested directly).
"""

from __future__ import annotations

import email.utils
import math
import time
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that say "not now": the request did nothing and may be sent again."""

_MAX_EXPONENT = 60  # 2**60 s is forever; keeps the float arithmetic finite


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def is_retryable_exception(exc: Exception) -> bool:
    """Connection failures and timeouts; not a bad URL or a request httpx refused to send."""
    return isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the client repeats an idempotent request that failed for a passing reason.

    Only idempotent requests are repeated: GET, DELETE, cancel, and POSTs that carry an
    Idempotency-Key (submit and generate always do). They are repeated after a connection
    failure and after 429, 502, 503 or 504, waiting what the server's Retry-After asks
    (giving up when it asks more than ``max_retry_after_s``), else ``backoff_s`` doubling
    up to ``max_backoff_s``. Other answers, 4xx above all, are never repeated.
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if not (self.backoff_s >= 0 and self.max_backoff_s >= 0 and self.max_retry_after_s >= 0):
            raise ValueError("backoff_s, max_backoff_s and max_retry_after_s must be >= 0")

    def backoff(self, retry: int) -> float:
        """The delay before repeat number ``retry + 1`` when the server gave no hint."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** min(retry, _MAX_EXPONENT))

    def delay(
        self,
        retry: int,
        *,
        idempotent: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> float | None:
        """Seconds to wait before repeating a request, or None to give up now.

        ``retry`` counts the repeats already made; ``status`` is None when no answer came
        (a connection failure), else the answer's status code.
        """
        if not idempotent or retry >= self.max_retries:
            return None
        if status is not None and status not in RETRY_STATUSES:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after_s else None
        return self.backoff(retry)


def poll_delay(
    polls: int, retry_after: float | None, *, interval: float, max_interval: float
) -> float:
    """How long wait() sleeps after its ``polls``-th look at an unfinished job.

    The delay doubles from ``interval`` up to ``max_interval``; the server's Retry-After hint
    is honoured as a floor (never poll sooner than it asks), so a long job is not polled
    every second just because the server's estimate ran out.
    """
    backoff = min(max_interval, interval * 2.0 ** min(polls, _MAX_EXPONENT))
    return backoff if retry_after is None else max(backoff, retry_after)


def reconnect_backoff(
    failures: int, retry_ms: int | None, *, base: float, max_delay: float
) -> float:
    """How long a stream waits before reconnecting after ``failures`` fruitless attempts.

    A connection that delivered events before it dropped reconnects at once (``failures``
    is 0); after that the delay starts at the server's ``retry:`` (else ``base``) and
    doubles, never above ``max_delay``.
    """
    if failures <= 0:
        return 0.0
    first = retry_ms / 1000 if retry_ms is not None else base
    return min(max_delay, first * 2.0 ** min(failures - 1, _MAX_EXPONENT))
