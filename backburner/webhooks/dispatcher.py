"""Delivers the webhook outbox: signed POSTs, a retry schedule, and a log of every attempt.

Runs inside every worker process. Messages are claimed from the backend under a lease, so a
dispatcher that dies mid-delivery leaves them due again (at-least-once; the ``webhook-id``
lets receivers drop repeats). A job that ends in this process pokes the dispatcher, so its
webhook leaves at once; other messages (a cancel sent to an API process, a crashed worker's)
are found by polling every ``POLL_S``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from ..errors import BackburnerError, UnsafeURLError
from ..hooks import Hooks
from ..models import (
    PROGRESS_EVENT,
    Job,
    JobStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookStatus,
)
from ..providers.base import parse_retry_after
from .signing import sign
from .ssrf import ParsedTarget, Resolver, check_url, pinned_request_args, resolve_safe

if TYPE_CHECKING:
    from ..app import Backburner

log = logging.getLogger("backburner.webhooks")

POLL_S = 0.5
"""How often the outbox is looked at when nothing pokes the dispatcher."""
LONGEST_RETRY_AFTER_S = 86400.0
USER_AGENT = "backburner-webhooks/1"
MAX_CLIENTS = 64
PER_RECEIVER = 8
"""Connections (and requests in flight) to one receiver at a time."""
"""Receivers (scheme, host, port) whose connections a dispatcher keeps open."""


def webhook_body(message: WebhookDelivery, job: Job | None) -> str:
    """The JSON body of a message: what the job's terminal state says."""
    body: dict[str, Any] = {"type": message.event, "task_id": message.task_id}
    if job is not None and message.event == PROGRESS_EVENT:
        body["status"] = job.status.value
        body["progress"] = job.progress.model_dump()
        body["metadata"] = job.metadata
        body["created_at"] = job.created_at
    elif job is not None:
        body["status"] = job.status.value
        if job.status is JobStatus.COMPLETED:
            body["result"] = job.result
        elif job.error is not None:
            body["error"] = job.error.model_dump()
        body["usage"] = job.usage.model_dump() if job.usage is not None else None
        body["metadata"] = job.metadata
        body["created_at"] = job.created_at
        body["finished_at"] = job.finished_at
    else:  # expired before its first attempt (its TTL was shorter than the outbox's delay)
        body["status"] = message.event.removeprefix("task.")
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
        self.lease_s = 2 * self.timeout_s + 1  # longer than one attempt can take
        self._resolver = resolver
        self._transport = transport
        self._clients: OrderedDict[
            tuple[str, str, int], tuple[httpx.AsyncClient, asyncio.Semaphore]
        ] = OrderedDict()
        self._inflight_closes: set[asyncio.Task[None]] = set()
        self._poke = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()

    def poke(self) -> None:
        """A message may be due now: look at once."""
        self._poke.set()

    def hook(self) -> Hooks:
        """A lifecycle hook that pokes this dispatcher when a job with a webhook ends here."""
        return _PokeOnEnd(self)

    async def run(self, stopping: asyncio.Event) -> None:
        """Deliver until ``stopping`` is set; then wait (bounded) for deliveries in flight."""
        backend = self.app.backend
        try:
            while not stopping.is_set():
                free = self.concurrency - len(self._inflight)
                if free > 0:
                    try:
                        messages = await backend.claim_webhooks(
                            now=self.app.clock.now(), limit=free, lease_s=self.lease_s
                        )
                    except BackburnerError as exc:
                        log.warning("webhook outbox: cannot claim (%s)", exc)
                        messages = []
                    for message in messages:
                        task = asyncio.create_task(self._deliver(message))
                        self._inflight.add(task)
                        task.add_done_callback(self._done)
                    if len(messages) == free:
                        continue  # there may be more due
                self._poke.clear()
                waits = [asyncio.ensure_future(e.wait()) for e in (self._poke, stopping)]
                try:
                    await asyncio.wait(waits, timeout=POLL_S, return_when="FIRST_COMPLETED")
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            if self._inflight:
                await asyncio.wait(self._inflight, timeout=self.timeout_s + 1)
            for task in self._inflight:
                task.cancel()
            for client, _ in self._clients.values():
                await client.aclose()
            self._clients.clear()

    def _client_for(self, target: ParsedTarget) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """One client (and connection pool) per receiver: requests go to a pinned IP, and a pool
        shared by two host names on one IP could carry one's request over a TLS connection
        verified for the other."""
        key = (target.scheme, target.host, target.port)
        known = self._clients.get(key)
        if known is not None:
            self._clients.move_to_end(key)
            return known
        if len(self._clients) >= MAX_CLIENTS:
            _, (oldest, _) = self._clients.popitem(last=False)
            closing = asyncio.create_task(oldest.aclose())
            self._inflight_closes.add(closing)
            closing.add_done_callback(self._inflight_closes.discard)
        client = httpx.AsyncClient(
            transport=self._transport,
            follow_redirects=False,
            timeout=httpx.Timeout(self.timeout_s),
            # httpcore's pool does work per connection for every request it places: a few
            # connections per receiver, kept open, and requests queue in _per_receiver instead.
            limits=httpx.Limits(
                max_connections=PER_RECEIVER, max_keepalive_connections=PER_RECEIVER
            ),
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
            trust_env=False,  # a proxy would connect to the host by name: no pinned address
        )
        pair = self._clients[key] = (client, asyncio.Semaphore(PER_RECEIVER))
        return pair

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if len(self._inflight) == self.concurrency - 1:
            self._poke.set()  # it was full: room again
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook delivery crashed: %r", task.exception())

    async def _deliver(self, message: WebhookDelivery) -> None:
        backend = self.app.backend
        body = message.body
        if body is None:
            body = webhook_body(message, await backend.get(message.task_id))
        attempt, verdict = await self.attempt(message, body)
        await backend.record_webhook_attempt(
            message.msg_id, attempt, status=verdict.status, next_at=verdict.next_at, body=body
        )
        if verdict.status is WebhookStatus.FAILED:
            log.warning(
                "webhook %s of job %s to %s failed for good: %s",
                message.msg_id,
                message.task_id,
                message.url,
                verdict.error,
            )

    async def attempt(self, message: WebhookDelivery, body: str) -> tuple[WebhookAttempt, Verdict]:
        """One POST of ``body``; what happened, and what it means for the message."""
        clock = self.app.clock
        at = clock.now()
        started = time.monotonic()
        status: int | None = None
        retry_after: float | None = None
        try:
            if not self.secrets:
                raise _NotSentError("no webhook secret is configured (BACKBURNER_WEBHOOK_SECRET)")
            target = check_url(message.url, allow=self.allow)
            ip = await resolve_safe(target, resolver=self._resolver, allow=self.allow)
            url, headers, extensions = pinned_request_args(target, ip)
            headers.update(sign(self.secrets, message.msg_id, int(time.time()), body.encode()))
            client, gate = self._client_for(target)
            async with gate:
                response = await client.post(
                    url, content=body.encode(), headers=headers, extensions=extensions
                )
            status = response.status_code
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except UnsafeURLError as exc:
            error = f"refused: {exc}"
            status = None
        except (_NotSentError, httpx.HTTPError, socket.gaierror, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        latency_ms = round((time.monotonic() - started) * 1000, 2)
        attempt = WebhookAttempt(at=at, status_code=status, latency_ms=latency_ms, error=error)
        unsafe = error is not None and error.startswith("refused:")
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
        again: after Retry-After for 429 and 503, else the schedule's next delay, jittered."""
        code = attempt.status_code
        if code is not None and 200 <= code < 300:
            return Verdict(WebhookStatus.DELIVERED, None, None)
        if code == 410 or unsafe:
            return Verdict(WebhookStatus.FAILED, None, attempt.error)
        done = len(message.attempts) + 1  # this one included
        if done >= len(self.schedule):
            return Verdict(WebhookStatus.FAILED, None, f"{attempt.error} (after {done} attempts)")
        if code in (429, 503) and retry_after is not None:
            delay = min(retry_after, LONGEST_RETRY_AFTER_S)
        else:
            delay = self.schedule[done] * random.uniform(0.9, 1.1)
        # From the end of the attempt: Retry-After counts from the answer.
        answered = attempt.at + (attempt.latency_ms or 0.0) / 1000
        return Verdict(WebhookStatus.PENDING, answered + delay, attempt.error)


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
