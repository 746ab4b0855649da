"""``Client``: the blocking SDK (``AsyncClient`` has the same methods, awaited)."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from ..errors import APIError, TransportError
from ..models import Event, JobStatus
from . import _http
from ._errors import raise_for_error
from ._options import ClientOptions, Pacer, StreamCursor, is_stream_retryable, unreachable
from ._policy import RETRY_STATUSES, RetryPolicy
from .models import Batch, Stats, Submission, Task, TaskPage, Usage, is_terminal_event
from .sse import SSEParser


class Client:
    """A blocking client for the backburner HTTP API.

    >>> with Client("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     job = client.generate("Explain leases in one line.", max_tokens=64)
    ...     print(client.wait(job.task_id, timeout=120).result)

    Errors raise ``backburner.errors`` classes (see ``APIError``); idempotent requests are
    repeated on connection failures, 429 and 502/503/504 (``retry``, a ``RetryPolicy``).
    wait() paces itself by ``poll_interval``/``max_poll_interval`` unless the server hints;
    stream() reconnects per ``reconnect_delay``/``max_reconnect_delay``/``max_reconnects``.
    ``sleep`` and ``clock`` replace ``time.sleep`` and ``time.monotonic`` (for tests).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_retries: int = 3,
        *,
        retry: RetryPolicy | None = None,
        poll_interval: float = 1.0,
        max_poll_interval: float = 30.0,
        reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 5.0,
        max_reconnects: int = 5,
        stream_read_timeout: float = 60.0,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.options = ClientOptions(
            retry=retry or RetryPolicy(max_retries=max_retries),
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
            reconnect_delay=reconnect_delay,
            max_reconnect_delay=max_reconnect_delay,
            max_reconnects=max_reconnects,
            stream_read_timeout=stream_read_timeout,
        )
        self._sleep = sleep or time.sleep
        self._clock = clock or time.monotonic
        self._http = httpx.Client(
            base_url=_http.base_url(base_url),
            headers=_http.default_headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (the context manager does it on exit)."""
        self._http.close()

    def _send(self, call: _http.Call) -> httpx.Response:
        request = call.build(self._http)
        retry = 0
        while True:
            call.sent += 1
            try:
                response = self._http.send(request, stream=call.stream)
            except httpx.TransportError as exc:
                delay = self.options.after_exception(retry, call, exc)
                if delay is None:
                    raise TransportError(unreachable(request, exc, retry)) from exc
            else:
                delay = self.options.after_response(retry, call, response)
                if delay is None:
                    return response
                response.close()
            self._sleep(delay)
            retry += 1

    def _look(self, call: _http.Call, pacer: Pacer) -> httpx.Response:
        """``call`` for a poll: an API away (a restart) is waited for, as ``Pacer`` says."""
        while True:
            try:
                response = self._send(call)
            except (TransportError, APIError) as exc:
                self._sleep(pacer.after_outage(exc))
                continue
            if response.status_code in RETRY_STATUSES:  # (503s past the client's retries)
                try:
                    raise_for_error(response, task_id=call.task_id)
                except APIError as exc:
                    self._sleep(pacer.after_outage(exc))
                    continue
            pacer.answered()
            return response

    def submit(
        self,
        type: str,
        input: Mapping[str, Any] | None = None,
        *,
        priority: int | str | None = None,
        webhook_url: str | None = None,
        webhook_progress: bool = False,
        metadata: Mapping[str, Any] | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        ttl_s: float | None = None,
        delay_s: float | None = None,
        idempotency_key: str | None = None,
    ) -> Submission:
        """Submit a job of a registered ``type``; returns at once with its id.

        Without an ``idempotency_key`` the client makes one up, so its own retries never
        create a second job. The same key with the same body gives the same job back
        (``created`` False); with another body it raises ``IdempotencyConflictError``.
        """
        call = _http.submit_call(
            type,
            input,
            priority=priority,
            webhook_url=webhook_url,
            webhook_progress=webhook_progress,
            metadata=metadata,
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            ttl_s=ttl_s,
            delay_s=delay_s,
            idempotency_key=idempotency_key,
        )
        return _http.parse_submission(self._send(call), call)

    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        model: str | None = None,
        max_tokens: int = 256,
        temperature: float | None = None,
        priority: int | str | None = None,
        webhook_url: str | None = None,
        webhook_progress: bool = False,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Submission:
        """Submit a text generation from a ``prompt`` or chat ``messages`` (exactly one)."""
        call = _http.generate_call(
            prompt,
            messages=messages,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            priority=priority,
            webhook_url=webhook_url,
            webhook_progress=webhook_progress,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        return _http.parse_submission(self._send(call), call)

    def get(self, task_id: str) -> Task:
        """The job now (raises ``JobNotFoundError`` if there is none)."""
        call = _http.get_call(task_id)
        return _http.parse(Task, self._send(call), call)

    def list(
        self,
        status: JobStatus | str | None = None,
        type: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page of jobs, newest first; pass ``next_cursor`` back for the next page."""
        call = _http.list_call(status, type, limit, cursor)
        return _http.parse(TaskPage, self._send(call), call)

    def iter_tasks(
        self, status: JobStatus | str | None = None, type: str | None = None, page_size: int = 100
    ) -> Iterator[Task]:
        """Every job matching the filters, newest first, fetching pages as needed."""
        cursor: str | None = None
        while True:
            page = self.list(status=status, type=type, limit=page_size, cursor=cursor)
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, task_id: str) -> Task:
        """Cancel the job (idempotent); returns it as it is after the cancel."""
        call = _http.cancel_call(task_id)
        return _http.parse(Task, self._send(call), call)

    def delete(self, task_id: str) -> None:
        """Delete a finished job and its events (``InvalidTransitionError`` while it runs)."""
        call = _http.delete_call(task_id)
        _http.parse_no_content(self._send(call), call)

    def dead_letters(self, limit: int = 50, cursor: str | None = None) -> TaskPage:
        """One page of the dead-letter queue: failed jobs with their attempt history."""
        call = _http.dead_letters_call(limit, cursor)
        return _http.parse(TaskPage, self._send(call), call)

    def replay(self, task_id: str) -> Task:
        """Re-queue a failed job with a fresh attempt budget (never retried: not idempotent)."""
        call = _http.replay_call(task_id)
        return _http.parse(Task, self._send(call), call)

    def stats(self) -> Stats:
        """Counts by status, queue depth by priority, DLQ size, live workers."""
        call = _http.stats_call()
        return _http.parse(Stats, self._send(call), call)

    def usage(self) -> Usage:
        """Your tenant, its jobs in flight and its limits (what a 429 is about)."""
        call = _http.usage_call()
        return _http.parse(Usage, self._send(call), call)

    # -- batches -------------------------------------------------------------------------

    def submit_batch(
        self,
        requests: Iterable[Mapping[str, Any]],
        *,
        model: str | None = None,
        priority: int | str | None = None,
        webhook_url: str | None = None,
        webhook_progress: bool = False,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Batch:
        """Submit many generations as one batch; returns at once with its id.

        Each request is ``{"custom_id", "prompt" | "messages", "model"?, "max_tokens"?, ...}``
        (custom_ids unique); ``model`` is the model of those that name none. One bad request
        refuses the batch (``InvalidInputError`` naming its custom_id); too many, 413
        (``InvalidInputError``, type ``batch_too_large``).
        """
        call = _http.submit_batch_call(
            requests,
            model=model,
            priority=priority,
            webhook_url=webhook_url,
            webhook_progress=webhook_progress,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        return _http.parse(Batch, self._send(call), call)

    def batch(self, batch_id: str) -> Batch:
        """The batch now: its status and request_counts (``JobNotFoundError`` if none)."""
        call = _http.get_batch_call(batch_id)
        return _http.parse(Batch, self._send(call), call)

    def cancel_batch(self, batch_id: str) -> Batch:
        """Cancel the batch (idempotent): its unfinished requests never run or stop."""
        call = _http.cancel_batch_call(batch_id)
        return _http.parse(Batch, self._send(call), call)

    def poll_batch(
        self,
        batch_id: str,
        *,
        timeout: float | None = None,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> Iterator[Batch]:
        """Yield the batch at each look until it has ended (the last one yielded), paced
        like ``poll``."""
        pacer = self.options.pacer(batch_id, timeout, poll_interval, max_poll_interval, self._clock)
        call = _http.get_batch_call(batch_id)
        while True:
            response = self._look(call, pacer)
            batch = _http.parse(Batch, response, call)
            yield batch
            if batch.is_terminal:
                return
            self._sleep(pacer.next_delay(batch.status.value, response))

    def wait_batch(
        self,
        batch_id: str,
        timeout: float | None = None,
        *,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> Batch:
        """Poll until the batch is completed, failed or cancelled, and return it."""
        snapshots = self.poll_batch(
            batch_id,
            timeout=timeout,
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
        )
        last: Batch = collections.deque(snapshots, maxlen=1)[0]  # it yields at least once
        return last

    def batch_results(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """The batch's results, streamed, one dict per finished request: ``{custom_id,
        task_id, status, result, error, usage}`` in no set order (once the batch ended, one
        per request). Not resumed if the connection drops: iterate again."""
        timeout = self.options.stream_timeout(self._http.timeout)
        # (opened as every call is: retried while the server is away or busy)
        response = self._send(_http.batch_results_call(batch_id, timeout))
        try:
            if response.is_error:
                response.read()
                raise_for_error(response, task_id=batch_id)
            try:
                for line in response.iter_lines():
                    row = _http.parse_result_line(line, response)
                    if row is not None:
                        yield row
            except httpx.HTTPError as exc:
                raise _http.results_cut(batch_id, exc) from exc
        finally:
            response.close()

    def poll(
        self,
        task_id: str,
        *,
        timeout: float | None = None,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> Iterator[Task]:
        """Yield the job at each look until it is terminal (the last one yielded).

        Sleeps between looks as the server's Retry-After asks, else ``poll_interval``
        doubling up to ``max_poll_interval``; raises ``WaitTimeoutError`` after ``timeout``.
        An API that cannot be reached or answers 503 (a restart) is looked at again, up to
        ``max_poll_interval`` apart, for 5 minutes before its error is raised.
        """
        pacer = self.options.pacer(task_id, timeout, poll_interval, max_poll_interval, self._clock)
        call = _http.get_call(task_id)
        while True:
            response = self._look(call, pacer)
            task = _http.parse(Task, response, call)
            yield task
            if task.is_terminal:
                return
            self._sleep(pacer.next_delay(task.status.value, response))

    def wait(
        self,
        task_id: str,
        timeout: float | None = None,
        *,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> Task:
        """Poll until the job is completed, failed or cancelled, and return it."""
        snapshots = self.poll(
            task_id,
            timeout=timeout,
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
        )
        last: Task = collections.deque(snapshots, maxlen=1)[0]  # poll yields at least once
        return last

    def stream(self, task_id: str, after: int | None = None) -> Iterator[Event]:
        """The job's events (after seq ``after``), live, ending with its terminal event.

        Reconnects with Last-Event-ID when the connection drops or closes early, so no
        event is skipped or repeated; gives up with ``TransportError`` after
        ``max_reconnects`` consecutive attempts that bring nothing new. (A replayed job
        has a terminal event mid-log; like the server, the stream ends at the latest one.)
        """
        cursor = StreamCursor(task_id, after, self.options)
        while True:
            parser = SSEParser()
            problem: Exception | None = None
            cursor.connecting()
            try:
                with contextlib.closing(self._events_once(task_id, cursor.last, parser)) as events:
                    for event in events:
                        if cursor.fresh(event.seq, is_terminal_event(event)):
                            yield event
            except (httpx.TransportError, APIError) as exc:
                if not is_stream_retryable(exc):
                    if isinstance(exc, APIError):
                        raise
                    raise TransportError(f"the event stream of {task_id} failed: {exc}") from exc
                problem = exc
            if problem is None:
                if cursor.terminal:
                    return  # the server closes a stream once its latest event is terminal
                if not cursor.progressed and self.get(task_id).is_terminal:
                    if cursor.settled:
                        return  # nothing after ``after``: the stream had ended before
                    cursor.settled = True
                    continue  # the job ended just now: a new read has its last events
            self._sleep(cursor.reconnect_delay(problem, parser.retry_ms))

    def _events_once(
        self, task_id: str, after: int | None, parser: SSEParser
    ) -> Generator[Event, None, None]:
        timeout = self.options.stream_timeout(self._http.timeout)
        path = _http.task_path(task_id, "/events")
        headers = _http.stream_headers(after)
        with self._http.stream("GET", path, headers=headers, timeout=timeout) as response:
            if response.is_error:
                response.read()
                raise_for_error(response, task_id=task_id)
            for chunk in response.iter_bytes():
                for message in parser.feed(chunk):
                    yield _http.parse_event(message, response)
