"""The knobs of a client and the decisions both clients take from them (no I/O here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ..errors import APIError, TransportError, WaitTimeoutError
from ._http import Call
from ._policy import (
    RETRY_STATUSES,
    RetryPolicy,
    is_retryable_exception,
    parse_retry_after,
    poll_delay,
    reconnect_backoff,
)


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Retry policy, wait() pacing and stream reconnection settings of one client."""

    retry: RetryPolicy
    poll_interval: float = 1.0
    max_poll_interval: float = 30.0
    reconnect_delay: float = 0.5
    max_reconnect_delay: float = 5.0
    max_reconnects: int = 5
    stream_read_timeout: float = 60.0

    def __post_init__(self) -> None:
        if not (0 < self.poll_interval <= self.max_poll_interval):
            raise ValueError("need 0 < poll_interval <= max_poll_interval")
        if not (0 <= self.reconnect_delay <= self.max_reconnect_delay):
            raise ValueError("need 0 <= reconnect_delay <= max_reconnect_delay")
        if self.max_reconnects < 0 or self.stream_read_timeout <= 0:
            raise ValueError("need max_reconnects >= 0 and stream_read_timeout > 0")

    def after_exception(self, retry: int, call: Call, exc: Exception) -> float | None:
        """Delay before repeating ``call`` after it got no answer, or None to give up."""
        if not is_retryable_exception(exc):
            return None
        return self.retry.delay(retry, idempotent=call.idempotent)

    def after_response(self, retry: int, call: Call, response: httpx.Response) -> float | None:
        """Delay before repeating ``call`` after this answer, or None to keep the answer."""
        if response.status_code not in RETRY_STATUSES:
            return None
        return self.retry.delay(
            retry,
            idempotent=call.idempotent,
            status=response.status_code,
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
        )

    def pacer(
        self,
        task_id: str,
        timeout: float | None,
        interval: float | None,
        max_interval: float | None,
        clock: Callable[[], float],
    ) -> Pacer:
        interval = self.poll_interval if interval is None else interval
        max_interval = self.max_poll_interval if max_interval is None else max_interval
        if not (0 < interval <= max_interval):
            raise ValueError("need 0 < poll_interval <= max_poll_interval")
        return Pacer(task_id, timeout, interval, max_interval, clock)

    def stream_timeout(self, timeout: httpx.Timeout) -> httpx.Timeout:
        """The client's timeouts, but a read may idle longer (the server sends keep-alives)."""
        return httpx.Timeout(
            connect=timeout.connect,
            read=self.stream_read_timeout,
            write=timeout.write,
            pool=timeout.pool,
        )

    def before_reconnect(
        self, failures: int, retry_ms: int | None, problem: Exception | None
    ) -> float | None:
        """Delay before a stream reconnects, or None to give up.

        ``failures`` counts the consecutive connections that brought no new event.
        """
        if failures > self.max_reconnects:
            return None
        delay = reconnect_backoff(
            failures, retry_ms, base=self.reconnect_delay, max_delay=self.max_reconnect_delay
        )
        if isinstance(problem, APIError) and problem.retry_after is not None:
            delay = max(delay, min(problem.retry_after, self.retry.max_retry_after_s))
        return delay


def is_stream_retryable(exc: Exception) -> bool:
    """A failure a stream recovers from by reconnecting."""
    if isinstance(exc, APIError):
        return exc.status in RETRY_STATUSES
    return is_retryable_exception(exc)


def unreachable(request: httpx.Request, exc: Exception, retries: int) -> str:
    tries = f" (after {retries + 1} attempts)" if retries else ""
    url = request.url.copy_with(username=None, password=None)  # (never a URL's password)
    return f"{request.method} {url} failed{tries}: {type(exc).__name__}: {exc}"


def stream_failure(task_id: str, failures: int, problem: Exception | None) -> str:
    cause = f"{type(problem).__name__}: {problem}" if problem else "closed early each time"
    return f"the event stream of {task_id} broke {failures} times in a row; last: {cause}"


class StreamCursor:
    """Where an event stream stands across reconnects: the last seq handed out, and how many
    connections in a row brought nothing new."""

    def __init__(self, task_id: str, after: int | None, options: ClientOptions) -> None:
        self.task_id = task_id
        self.last = after
        self.options = options
        self.failures = 0
        self.progressed = False
        self.terminal = False  # the last event handed out is a terminal status
        self.retry_ms: int | None = None  # the server's last ``retry:``; it outlives connections
        self.settled = False  # an empty close was seen while the job was already terminal

    def connecting(self) -> None:
        self.progressed = False

    def fresh(self, seq: int, terminal: bool) -> bool:
        """True for an event not handed out before (a resumed stream may overlap)."""
        if self.last is not None and seq <= self.last:
            return False
        self.last = seq
        self.terminal = terminal
        self.progressed = True
        self.settled = False
        return True

    def reconnect_delay(self, problem: Exception | None, retry_ms: int | None) -> float:
        """Delay before the next connection; raises TransportError when it is time to stop."""
        self.failures = 0 if self.progressed else self.failures + 1
        self.retry_ms = self.retry_ms if retry_ms is None else retry_ms
        delay = self.options.before_reconnect(self.failures, self.retry_ms, problem)
        if delay is None:
            raise TransportError(stream_failure(self.task_id, self.failures, problem)) from problem
        return delay


OUTAGE_S = 300.0
"""How long wait() and poll() keep looking at an API that cannot be reached or answers 503."""


class Pacer:
    """wait()'s clock: the delay before the next look at a job, and its deadline."""

    def __init__(
        self,
        task_id: str,
        timeout: float | None,
        interval: float,
        max_interval: float,
        clock: Callable[[], float],
    ) -> None:
        self.task_id = task_id
        self.timeout = timeout
        self.interval = interval
        self.max_interval = max_interval
        self.clock = clock
        self.deadline = None if timeout is None else clock() + timeout
        self.polls = 0
        self.status = "unknown"
        """The job's status at the last look that was answered."""
        self.down_since: float | None = None

    def after_outage(self, problem: Exception) -> float:
        """Seconds to wait before looking again after a look that could not be made (the
        API restarting, or answering 503 past the client's own retries); re-raises
        ``problem`` once the API has been away for OUTAGE_S, or past the deadline. A wait
        for an hours-long job rode out no more than 3.5 s of a restart. A 503's Retry-After
        is a floor under the delay, as for a poll's."""
        now = self.clock()
        if self.down_since is None:
            self.down_since = now
        cause = problem.__cause__ if isinstance(problem, TransportError) else problem
        passing = isinstance(cause, Exception) and is_stream_retryable(cause)
        if not passing or now - self.down_since >= OUTAGE_S:
            raise problem
        delay = min(self.max_interval, 2.0 ** min(self.polls, 5))
        self.polls += 1
        asked = problem.retry_after if isinstance(problem, APIError) else None
        if asked is not None:  # a 503's Retry-After, short of the outage's end (a last look)
            delay = max(delay, min(asked, OUTAGE_S - (now - self.down_since)))
        if self.deadline is not None and self.timeout is not None:
            left = self.deadline - now
            if left <= 0:  # (as a wait that ran out of time while the API answered)
                raise WaitTimeoutError(self.task_id, self.timeout, self.status) from problem
            delay = min(delay, left)
        return delay

    def answered(self) -> None:
        self.down_since = None

    def next_delay(self, status: str, response: httpx.Response) -> float:
        """Seconds to sleep before looking again; raises WaitTimeoutError past the deadline."""
        self.status = status
        hint = parse_retry_after(response.headers.get("Retry-After"))
        delay = poll_delay(self.polls, hint, interval=self.interval, max_interval=self.max_interval)
        self.polls += 1
        if self.deadline is not None and self.timeout is not None:
            left = self.deadline - self.clock()
            if left <= 0:
                raise WaitTimeoutError(self.task_id, self.timeout, status)
            delay = min(delay, left)  # one last look at the deadline
        return delay
