"""Delivers the webhook outbox: signed POSTs, a retry schedule, and a log of every attempt.

Runs inside every worker process. Messages are claimed from the backend under a lease, so a
dispatcher that dies mid-delivery leaves them due again (at-least-once; the ``webhook-id``
lets receivers drop repeats). A job that ends in this process pokes the dispatcher, so its
webhook leaves at once; other messages (a cancel sent to an API process, a crashed worker's)
are found by polling every ``POLL_S``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..aio import done_unless_set, wait_all_or, wait_set
from ..errors import BackburnerError, CorruptRecordError, UnsafeURLError
from ..hooks import Hooks
from ..models import (
    PROGRESS_EVENT,
    WEBHOOK_EVENTS,
    Job,
    JobStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookStatus,
)
from ..observability.logs import worth_logging
from ..providers.base import parse_retry_after
from .receivers import PER_RECEIVER, ReceiverBusyError, ReceiverPool
from .signing import sign
from .ssrf import ParsedTarget, Resolver, check_url, pinned_request_args, resolve_all_safe

if TYPE_CHECKING:
    import httpx

    from ..app import Backburner

log = logging.getLogger("backburner.webhooks")

POLL_S = 0.5
"""How often the outbox is looked at when nothing pokes the dispatcher."""
LONGEST_RETRY_AFTER_S = 86400.0
MAX_RESPONSE_BYTES = 64 * 1024
"""How much of a receiver's answer is read (the rest is dropped with the connection)."""
LEASE_MARGIN_S = 5.0
HELD_PER_RECEIVER = 2 * PER_RECEIVER
"""Messages to one receiver a dispatcher sends at once: its connections' worth sending, as
many waiting for one."""
DRAINING_S = 2.0
"""A receiver with HELD_PER_RECEIVER messages in flight is draining if the oldest of them
started less than this ago: its further messages wait here, in its line, for its next free
slot (a backlog to a fast receiver goes out as fast as it answers; it went out 16 a lease).
One whose oldest started earlier is slow or hung: its further messages stay leased in the
outbox until their lease ends. A line holds no slot: other receivers' messages are claimed
and sent meanwhile."""
LINE_WAIT_S = LEASE_MARGIN_S - 1.0
"""The longest a claimed message waits in its receiver's line: its lease, taken at the claim,
must outlast the wait plus an attempt (2 x timeout); one that waited longer is let go (due
again when its lease ends)."""


def webhook_body(message: WebhookDelivery, job: Job | None) -> str:
    """The JSON body of a message: what the job's state says about its event."""
    body: dict[str, Any] = {"type": message.event, "task_id": message.task_id}
    terminal = message.event != PROGRESS_EVENT
    if job is None or (terminal and WEBHOOK_EVENTS.get(job.status) != message.event):
        # Deleted, unreadable, or replayed since (a failed job queued again): the event alone.
        body["status"] = message.event.removeprefix("task.")
        return json.dumps(body, separators=(",", ":"))
    body["status"] = job.status.value
    if not terminal:
        body["progress"] = job.progress.model_dump()
    elif job.status is JobStatus.COMPLETED:
        body["result"] = job.result
    elif job.error is not None:
        body["error"] = job.error.model_dump()
    if terminal:
        body["usage"] = job.usage.model_dump() if job.usage is not None else None
    body["metadata"] = job.metadata
    body["created_at"] = job.created_at
    if terminal:
        body["finished_at"] = job.finished_at
    return json.dumps(body, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one attempt's answer means for the message."""

    status: WebhookStatus
    next_at: float | None
    error: str | None


class WebhookDispatcher:
    """Claims due messages and delivers up to ``concurrency`` of them at once."""

    def __init__(
        self,
        app: Backburner,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        settings = app.settings
        self.app = app
        self.schedule = settings.retry_schedule()
        self.secrets: Sequence[str] = (settings.webhook_secret or "").split()
        self.allow = settings.allowed_webhook_hosts()
        self.timeout_s = settings.webhook_timeout_s
        self.concurrency = settings.webhook_concurrency
        # An attempt waits at most timeout_s for a connection, then takes at most timeout_s
        # (lookup, request, response): its lease outlasts both, so no one else sends it.
        self.lease_s = 2 * self.timeout_s + LEASE_MARGIN_S
        self._resolver = resolver
        self._receivers = ReceiverPool(timeout_s=self.timeout_s, transport=transport)
        self._poke = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._held: Counter[tuple[str, str, int] | None] = Counter()
        """Messages in flight per receiver (scheme, host, port), sending or waiting for one
        of its connections."""
        self._started: dict[tuple[str, str, int] | None, dict[asyncio.Task[None], float]] = {}
        """When each message in flight to each receiver started."""
        self._lines: dict[tuple[str, str, int] | None, deque[tuple[WebhookDelivery, float]]] = {}
        """Claimed messages of draining receivers waiting for a slot, with their claim time."""
        self._closing = False
        """Set as run() stops: a slot freed then starts nothing from a line (its leases end)."""

    def poke(self) -> None:
        """A message may be due now: look at once."""
        self._poke.set()

    def hook(self) -> Hooks:
        """A lifecycle hook that pokes this dispatcher when a job with a webhook ends here."""
        return _PokeOnEnd(self)

    async def run(self, stopping: asyncio.Event, hurry: asyncio.Event | None = None) -> None:
        """Deliver until ``stopping`` is set; then wait (bounded, and cut short once ``hurry``
        is set) for deliveries in flight."""
        backend = self.app.backend
        failed = 0  # claims in a row: a backend that is down is said once a streak
        try:
            # (once hurried, what it claimed now it would only cut short)
            while not stopping.is_set() and not (hurry is not None and hurry.is_set()):
                self._let_go_of_waits(time.monotonic())
                free = self.concurrency - len(self._inflight)
                if free > 0:
                    claiming = asyncio.ensure_future(
                        backend.claim_webhooks(
                            now=self.app.clock.now(), limit=free, lease_s=self.lease_s
                        )
                    )
                    if not await done_unless_set(claiming, stopping):
                        # A claim waits as long as the backend does (a SQLite file locked
                        # by another process: 30 s), and held a worker's shutdown that long.
                        # (One that lands anyway leaves leases that end; others send them.)
                        break
                    try:
                        messages = claiming.result()
                    except Exception as exc:  # the loop must outlive any one failure
                        failed += 1
                        if worth_logging(failed):
                            log.warning(
                                "webhook outbox: cannot claim (%r; %d in a row); trying again",
                                exc,
                                failed,
                            )
                        await _pause(stopping, POLL_S)
                        continue
                    if failed:
                        log.info("webhook outbox: claims work again after %d failures", failed)
                        failed = 0
                    now = time.monotonic()
                    for message in messages:
                        receiver = self._receiver_of(message)
                        if self._held[receiver] < HELD_PER_RECEIVER:
                            self._start(receiver, message)
                        elif self._draining(receiver, now):
                            self._lines.setdefault(receiver, deque()).append((message, now))
                        # Else its receiver is slow or hung: the message is due again when its
                        # lease ends, and that receiver holds at most HELD_PER_RECEIVER of
                        # the slots every other receiver's messages need.
                    if len(messages) == free:
                        continue  # there may be more due
                self._poke.clear()
                wakers = (self._poke, stopping) if hurry is None else (self._poke, stopping, hurry)
                waits = [asyncio.ensure_future(e.wait()) for e in wakers]
                try:
                    await asyncio.wait(waits, timeout=POLL_S, return_when="FIRST_COMPLETED")
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            self._closing = True
            try:
                await wait_all_or(set(self._inflight), hurry, self.lease_s)
            finally:  # (cancelled while it waits: what follows runs all the same)
                for task in self._inflight:
                    task.cancel()  # their leases end, and another worker sends them
                await asyncio.gather(*self._inflight, return_exceptions=True)
                await self._receivers.aclose()

    def _receiver_of(self, message: WebhookDelivery) -> tuple[str, str, int] | None:
        """The receiver a message goes to (None: its URL is refused, as its attempt says)."""
        try:
            target = check_url(message.url, allow=self.allow)
        except UnsafeURLError:
            return None
        return (target.scheme, target.host, target.port)

    def _start(self, receiver: tuple[str, str, int] | None, message: WebhookDelivery) -> None:
        self._held[receiver] += 1
        task = asyncio.create_task(self._deliver(message))
        self._inflight.add(task)
        self._started.setdefault(receiver, {})[task] = time.monotonic()
        task.add_done_callback(functools.partial(self._done, receiver))

    def _draining(self, receiver: tuple[str, str, int] | None, now: float) -> bool:
        started = self._started.get(receiver)
        if not started:
            return False
        return now - min(started.values()) < DRAINING_S

    def _done(self, receiver: tuple[str, str, int] | None, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        started = self._started.get(receiver)
        if started is not None:
            started.pop(task, None)
            if not started:
                del self._started[receiver]
        self._held[receiver] -= 1
        if not self._held[receiver]:
            del self._held[receiver]
        line = self._lines.get(receiver)
        now = time.monotonic()
        while line:
            message, claimed = line.popleft()
            if now - claimed <= LINE_WAIT_S and not self._closing:
                self._start(receiver, message)  # (its slot, at once)
                break
        if line is not None and not line:
            del self._lines[receiver]
        if len(self._inflight) == self.concurrency - 1:
            self._poke.set()  # it was full: room again
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook delivery crashed: %r", task.exception())

    def _let_go_of_waits(self, now: float) -> None:
        """Drop the messages that waited in a line too long (their leases end; then they are
        due again): a receiver that drained when they came may have hung since."""
        for receiver in list(self._lines):
            line = self._lines[receiver]
            while line and now - line[0][1] > LINE_WAIT_S:
                line.popleft()
            if not line:
                del self._lines[receiver]

    async def _deliver(self, message: WebhookDelivery) -> None:
        backend = self.app.backend
        tracing = self.app.tracing
        body = message.body
        job = None
        if body is None:
            try:
                job = await backend.get(message.task_id)
            except CorruptRecordError:  # its job failed as unreadable: the message says so
                job = None
        elif tracing.enabled:
            try:
                job = await backend.get(message.task_id)
            except BackburnerError:  # the trace is not worth a failed delivery
                job = None
        if body is None:
            body = webhook_body(message, job)
        with tracing.webhook(message, job.traceparent if job is not None else None) as span:
            result = await self.attempt(message, body)
            if span is not None and result is not None:
                span.set_attribute("http.response.status_code", result[0].status_code or 0)
                span.set_attribute("backburner.webhook.outcome", result[1].status.value)
        if result is None:
            return  # the receiver was busy throughout: due again when the lease ends
        attempt, verdict = result
        metrics = self.app.metrics
        outcome = "retry" if verdict.status is WebhookStatus.PENDING else verdict.status.value
        metrics.webhook_deliveries.labels(outcome).inc()
        metrics.webhook_latency.observe((attempt.latency_ms or 0.0) / 1000)
        recorded = await backend.record_webhook_attempt(
            message.msg_id,
            message.claim,
            attempt,
            status=verdict.status,
            next_at=verdict.next_at,
            body=body,
        )
        if recorded and message.event == PROGRESS_EVENT and message.body is None:
            await self._after_progress(job)
        if recorded and verdict.status is WebhookStatus.FAILED:
            log.warning(
                "webhook %s of job %s to %s failed for good: %s",
                message.msg_id,
                message.task_id,
                receiver_name(message.url),  # (a URL's path and query may hold its token)
                verdict.error,
                extra={
                    "task_id": message.task_id,
                    "msg_id": message.msg_id,
                    "event": "webhook_failed",
                },
            )

    async def _after_progress(self, sent: Job | None) -> None:
        """A progress message went with the job's progress as it was read for it. One
        reported while it was on its way was folded into it (at most one unsent progress
        message a job: a slow receiver gets the latest, not a backlog): if the job has moved
        on since, another follows with the latest."""
        if sent is None:
            return
        backend = self.app.backend
        try:
            now = await backend.get(sent.task_id)
            if now is None:
                return
            if now.status is JobStatus.PROCESSING and now.progress != sent.progress:
                await backend.add_progress_webhook(now.task_id, now.fence, now=self.app.clock.now())
        except BackburnerError:  # ended, gone or taken over meanwhile: nothing to follow
            return

    async def attempt(
        self, message: WebhookDelivery, body: str
    ) -> tuple[WebhookAttempt, Verdict] | None:
        """One POST of ``body``: what happened and what it means for the message; None if
        the receiver's connections stayed busy (no attempt was made)."""
        at = self.app.clock.now()
        started = time.monotonic()
        status: int | None = None
        retry_after: float | None = None
        unsafe = False
        try:
            if not self.secrets:
                raise _NotSentError("no webhook secret is configured (BACKBURNER_WEBHOOK_SECRET)")
            target = check_url(message.url, allow=self.allow)
            async with self._receivers.connection(target, wait_s=self.timeout_s) as client:
                started = time.monotonic()
                at = self.app.clock.now()
                async with asyncio.timeout(self.timeout_s):  # the whole attempt, not per read
                    ips = await resolve_all_safe(target, resolver=self._resolver, allow=self.allow)
                    signed = sign(self.secrets, message.msg_id, int(time.time()), body.encode())
                    response = await _post_to_first_reachable(client, target, ips, body, signed)
                    try:
                        status = response.status_code
                        retry_after = parse_retry_after(
                            response.headers.get("retry-after"), longest=LONGEST_RETRY_AFTER_S
                        )
                        await _discard(response)
                    finally:
                        await response.aclose()
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except ReceiverBusyError:
            return None
        except UnsafeURLError as exc:
            error, unsafe = f"refused: {exc}", True
        except TimeoutError:
            error = f"timed out after {self.timeout_s:g} s"
        except _NotSentError as exc:
            error = str(exc)
        except Exception as exc:  # any failure is a failed attempt, logged and retried
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        latency_ms = round((time.monotonic() - started) * 1000, 2)
        attempt = WebhookAttempt(at=at, status_code=status, latency_ms=latency_ms, error=error)
        return attempt, self.verdict(message, attempt, retry_after, unsafe=unsafe)

    def verdict(
        self,
        message: WebhookDelivery,
        attempt: WebhookAttempt,
        retry_after: float | None,
        *,
        unsafe: bool = False,
    ) -> Verdict:
        """Delivered (2xx), failed for good (410, an unsafe URL, the schedule ran out), or due
        again: after the schedule's next delay, jittered, or a 429's or 503's Retry-After if
        that is longer."""
        code = attempt.status_code
        if code is not None and 200 <= code < 300:
            return Verdict(WebhookStatus.DELIVERED, None, None)
        if code == 410 or unsafe:
            return Verdict(WebhookStatus.FAILED, None, attempt.error)
        done = message.tries + 1  # this one included
        if done >= len(self.schedule):
            return Verdict(WebhookStatus.FAILED, None, f"{attempt.error} (after {done} attempts)")
        delay = self.schedule[done] * random.uniform(0.9, 1.1)
        if code in (429, 503) and retry_after is not None:
            # Never sooner than the schedule: a receiver that answers "Retry-After: 0" under
            # load would see every attempt in a few seconds, and the message failed for good.
            delay = max(delay, retry_after)
        # From the end of the attempt: Retry-After counts from the answer.
        answered = attempt.at + (attempt.latency_ms or 0.0) / 1000
        return Verdict(WebhookStatus.PENDING, answered + delay, attempt.error)


def receiver_name(url: str) -> str:
    """A webhook URL without what may be secret in it (Slack's and others' tokens are in the
    path, many in the query): its scheme, host and port."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"


class _NotSentError(Exception):
    """The attempt could not start (no secret): retried on the schedule, like a refusal."""


class _PokeOnEnd(Hooks):
    def __init__(self, dispatcher: WebhookDispatcher) -> None:
        self._dispatcher = dispatcher

    async def on_complete(self, job: Job) -> None:
        if job.webhook_url is not None:
            self._dispatcher.poke()

    async def on_fail(self, job: Job) -> None:
        if job.webhook_url is not None:
            self._dispatcher.poke()

    async def on_cancel(self, job: Job) -> None:
        if job.webhook_url is not None:
            self._dispatcher.poke()


async def _post_to_first_reachable(
    client: httpx.AsyncClient,
    target: ParsedTarget,
    ips: Sequence[str],
    body: str,
    signed: dict[str, str],
) -> httpx.Response:
    """POST to the receiver at the first of its addresses that takes a connection: a name
    with an IPv6 address this host cannot reach, and an IPv4 one it can, still gets its
    webhooks (only a refused or failed connect moves on: nothing was sent)."""
    import httpx

    for index, ip in enumerate(ips):
        url, headers, extensions = pinned_request_args(target, ip)
        headers.update(signed)
        request = client.build_request(
            "POST", url, content=body.encode(), headers=headers, extensions=extensions
        )
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError:
            if index == len(ips) - 1:
                raise
    raise AssertionError("no address to send to")  # pragma: no cover (resolve gives one)


async def _discard(response: httpx.Response) -> None:
    """Read at most MAX_RESPONSE_BYTES of a receiver's answer, and drop it."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read >= MAX_RESPONSE_BYTES:
            break


async def _pause(stopping: asyncio.Event, seconds: float) -> None:
    await wait_set(stopping, seconds)
