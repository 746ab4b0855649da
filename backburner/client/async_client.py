"""``AsyncClient``: the asyncio SDK, method for method the same as ``Client``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
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


class AsyncClient:
    """An asyncio client for the backburner HTTP API.

    >>> async with AsyncClient("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     job = await client.generate("Explain leases in one line.", max_tokens=64)
    ...     print((await client.wait(job.task_id, timeout=120)).result)

    Errors raise ``backburner.errors`` classes (see ``APIError``); idempotent requests are
    repeated on connection failures, 429 and 502/503/504 (``retry``, a ``RetryPolicy``).
    wait() paces itself by ``poll_interval``/``max_poll_interval`` unless the server hints;
    stream() reconnects per ``reconnect_delay``/``max_reconnect_delay``/``max_reconnects``.
    ``sleep`` and ``clock`` replace ``asyncio.sleep`` and ``time.monotonic`` (for tests).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_retries: int = 3,
        *,
        retry: RetryPolicy | None = None,
        poll_interval: float = 1.0,
        max_poll_interval: float = 30.0,
        reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 5.0,
        max_reconnects: int = 5,
        stream_read_timeout: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] | None = None,
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
        self._sleep = sleep or asyncio.sleep
        self._clock = clock or time.monotonic
        self._http = httpx.AsyncClient(
            base_url=_http.base_url(base_url),
            headers=_http.default_headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (the context manager does it on exit)."""
        await self._http.aclose()

    async def close(self) -> None:
        """The same as ``aclose()``."""
        await self.aclose()

    async def _send(self, call: _http.Call) -> httpx.Response:
        request = call.build(self._http)
        retry = 0
        while True:
            call.sent += 1
            try:
                response = await self._http.send(request, stream=call.stream)
            except httpx.TransportError as exc:
                delay = self.options.after_exception(retry, call, exc)
                if delay is None:
                    raise TransportError(unreachable(request, exc, retry)) from exc
            else:
                delay = self.options.after_response(retry, call, response)
                if delay is None:
                    return response
                await response.aclose()
            await self._sleep(delay)
            retry += 1

    async def _look(self, call: _http.Call, pacer: Pacer) -> httpx.Response:
        """``call`` for a poll: an API away (a restart) is waited for, as ``Pacer`` says."""
        while True:
            try:
                response = await self._send(call)
            except (TransportError, APIError) as exc:
                await self._sleep(pacer.after_outage(exc))
                continue
            if response.status_code in RETRY_STATUSES:  # (503s past the client's retries)
                try:
                    raise_for_error(response, task_id=call.task_id)
                except APIError as exc:
                    await self._sleep(pacer.after_outage(exc))
                    continue
            pacer.answered()
            return response

    async def submit(
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
        return _http.parse_submission(await self._send(call), call)

    async def generate(
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
        return _http.parse_submission(await self._send(call), call)

    async def get(self, task_id: str) -> Task:
        """The job now (raises ``JobNotFoundError`` if there is none)."""
        call = _http.get_call(task_id)
        return _http.parse(Task, await self._send(call), call)

    async def list(
        self,
        status: JobStatus | str | None = None,
        type: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page of jobs, newest first; pass ``next_cursor`` back for the next page."""
        call = _http.list_call(status, type, limit, cursor)
        return _http.parse(TaskPage, await self._send(call), call)

    async def iter_tasks(
        self, status: JobStatus | str | None = None, type: str | None = None, page_size: int = 100
    ) -> AsyncIterator[Task]:
        """Every job matching the filters, newest first, fetching pages as needed."""
        cursor: str | None = None
        while True:
            page = await self.list(status=status, type=type, limit=page_size, cursor=cursor)
            for task in page.data:
                yield task
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel(self, task_id: str) -> Task:
        """Cancel the job (idempotent); returns it as it is after the cancel."""
        call = _http.cancel_call(task_id)
        return _http.parse(Task, await self._send(call), call)

    async def delete(self, task_id: str) -> None:
        """Delete a finished job and its events (``InvalidTransitionError`` while it runs)."""
        call = _http.delete_call(task_id)
        _http.parse_no_content(await self._send(call), call)

    async def dead_letters(self, limit: int = 50, cursor: str | None = None) -> TaskPage:
        """One page of the dead-letter queue: failed jobs with their attempt history."""
        call = _http.dead_letters_call(limit, cursor)
        return _http.parse(TaskPage, await self._send(call), call)

    async def replay(self, task_id: str) -> Task:
        """Re-queue a failed job with a fresh attempt budget (never retried: not idempotent)."""
        call = _http.replay_call(task_id)
        return _http.parse(Task, await self._send(call), call)

    async def stats(self) -> Stats:
        """Counts by status, queue depth by priority, DLQ size, live workers."""
        call = _http.stats_call()
        return _http.parse(Stats, await self._send(call), call)

    async def usage(self) -> Usage:
        """Your tenant, its jobs in flight and its limits (what a 429 is about)."""
        call = _http.usage_call()
        return _http.parse(Usage, await self._send(call), call)

    # -- batches -------------------------------------------------------------------------

    async def submit_batch(
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
        return _http.parse(Batch, await self._send(call), call)

    async def batch(self, batch_id: str) -> Batch:
        """The batch now: its status and request_counts (``JobNotFoundError`` if none)."""
        call = _http.get_batch_call(batch_id)
        return _http.parse(Batch, await self._send(call), call)

    async def cancel_batch(self, batch_id: str) -> Batch:
        """Cancel the batch (idempotent): its unfinished requests never run or stop."""
        call = _http.cancel_batch_call(batch_id)
        return _http.parse(Batch, await self._send(call), call)

    async def poll_batch(
        self,
        batch_id: str,
        *,
        timeout: float | None = None,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> AsyncIterator[Batch]:
        """Yield the batch at each look until it has ended (the last one yielded), paced
        like ``poll``."""
        pacer = self.options.pacer(batch_id, timeout, poll_interval, max_poll_interval, self._clock)
        call = _http.get_batch_call(batch_id)
        while True:
            response = await self._look(call, pacer)
            batch = _http.parse(Batch, response, call)
            yield batch
            if batch.is_terminal:
                return
            await self._sleep(pacer.next_delay(batch.status.value, response))

    async def wait_batch(
        self,
        batch_id: str,
        timeout: float | None = None,
        *,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> Batch:
        """Poll until the batch is completed, failed or cancelled, and return it."""
        last: Batch | None = None
        async for batch in self.poll_batch(
            batch_id,
            timeout=timeout,
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
        ):
            last = batch
        assert last is not None  # poll_batch yields at least once
        return last

    async def batch_results(self, batch_id: str) -> AsyncIterator[dict[str, Any]]:
        """The batch's results, streamed, one dict per finished request: ``{custom_id,
        task_id, status, result, error, usage}`` in no set order (once the batch ended, one
        per request). Not resumed if the connection drops: iterate again."""
        timeout = self.options.stream_timeout(self._http.timeout)
        # (opened as every call is: retried while the server is away or busy)
        response = await self._send(_http.batch_results_call(batch_id, timeout))
        try:
            if response.is_error:
                await response.aread()
                raise_for_error(response, task_id=batch_id)
            try:
                async for line in response.aiter_lines():
                    row = _http.parse_result_line(line, response)
                    if row is not None:
                        yield row
            except httpx.HTTPError as exc:
                raise _http.results_cut(batch_id, exc) from exc
        finally:
            await response.aclose()

    async def poll(
        self,
        task_id: str,
        *,
        timeout: float | None = None,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> AsyncIterator[Task]:
        """Yield the job at each look until it is terminal (the last one yielded).

        Sleeps between looks as the server's Retry-After asks, else ``poll_interval``
        doubling up to ``max_poll_interval``; raises ``WaitTimeoutError`` after ``timeout``.
        An API that cannot be reached or answers 503 (a restart) is looked at again, up to
        ``max_poll_interval`` apart, for 5 minutes before its error is raised.
        """
        pacer = self.options.pacer(task_id, timeout, poll_interval, max_poll_interval, self._clock)
        call = _http.get_call(task_id)
        while True:
            response = await self._look(call, pacer)
            task = _http.parse(Task, response, call)
            yield task
            if task.is_terminal:
                return
            await self._sleep(pacer.next_delay(task.status.value, response))

    async def wait(
        self,
        task_id: str,
        timeout: float | None = None,
        *,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
    ) -> Task:
        """Poll until the job is completed, failed or cancelled, and return it."""
        last: Task | None = None
        async for task in self.poll(
            task_id,
            timeout=timeout,
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
        ):
            last = task
        assert last is not None  # poll yields at least once
        return last

    async def stream(self, task_id: str, after: int | None = None) -> AsyncIterator[Event]:
        """The job's events (after seq ``after``), live, ending with its terminal event.

        Reconnects with Last-Event-ID when the connection drops or closes early, so no
        event is skipped or repeated; gives up with ``TransportError`` after
        ``max_reconnects`` consecutive attempts that bring nothing new. (A replayed job
        has a terminal event mid-log; like the server, the stream ends at the latest one.)
        To stop early, iterate inside ``async with contextlib.aclosing(client.stream(id))``
        so the connection closes at once rather than when the generator is collected.
        """
        cursor = StreamCursor(task_id, after, self.options)
        while True:
            parser = SSEParser()
            problem: Exception | None = None
            cursor.connecting()
            try:
                events = self._events_once(task_id, cursor.last, parser)
                async with contextlib.aclosing(events):
                    async for event in events:
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
                if not cursor.progressed and (await self.get(task_id)).is_terminal:
                    if cursor.settled:
                        return  # nothing after ``after``: the stream had ended before
                    cursor.settled = True
                    continue  # the job ended just now: a new read has its last events
            await self._sleep(cursor.reconnect_delay(problem, parser.retry_ms))

    async def _events_once(
        self, task_id: str, after: int | None, parser: SSEParser
    ) -> AsyncGenerator[Event, None]:
        timeout = self.options.stream_timeout(self._http.timeout)
        path = _http.task_path(task_id, "/events")
        headers = _http.stream_headers(after)
        async with self._http.stream("GET", path, headers=headers, timeout=timeout) as response:
            if response.is_error:
                await response.aread()
                raise_for_error(response, task_id=task_id)
            async for chunk in response.aiter_bytes():
                for message in parser.feed(chunk):
                    yield _http.parse_event(message, response)
