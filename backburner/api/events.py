"""Server-sent events: one job's event log, live, resumable by ``Last-Event-ID``.

Each API process runs one ``EventHub`` task that waits on the backend for new events of every
job somebody is streaming (one ``wait_for_events`` call for all of them), and wakes just the
streams whose job moved. A stream then reads its new events itself, so it never misses or
repeats one: its position is the last ``seq`` it sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..aio import wait_set
from ..backends import Backend
from ..errors import BackendError
from ..models import Event, is_terminal_event

log = logging.getLogger("backburner.api.events")

BATCH = 500


@dataclass(eq=False)
class Subscription:
    task_id: str
    after: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class EventHub:
    """Multiplexes every open stream of this process onto one backend wait."""

    def __init__(self, backend: Backend, *, idle_timeout_s: float = 30.0) -> None:
        self.backend = backend
        self.idle_timeout_s = idle_timeout_s
        self._subs: dict[str, set[Subscription]] = {}
        self._heads: dict[str, int] = {}
        """The latest seq seen per job: the hub waits past it, whoever lags behind."""
        self._gone: set[str] = set()
        """Jobs found missing (deleted, expired): their streams were woken once to see it for
        themselves; waiting on them again would answer at once, over and over, while a
        stream stuck on a slow client cannot end."""
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.draining = False
        """The server is shutting down: every stream ends at its next step (``drain``)."""

    @property
    def subscriptions(self) -> int:
        """How many streams are open in this process."""
        return sum(len(subs) for subs in self._subs.values())

    def subscribe(self, task_id: str, after: int) -> Subscription:
        """Follow ``task_id`` from seq ``after``; ``sub.wake`` is set when there is more."""
        sub = Subscription(task_id, after)
        self._subs.setdefault(task_id, set()).add(sub)
        self._gone.discard(task_id)  # (looked for again: the new stream is told too)
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="backburner-event-hub")
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop following (a stream ended or its client went away)."""
        subs = self._subs.get(sub.task_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.task_id]
                self._heads.pop(sub.task_id, None)
                self._gone.discard(sub.task_id)
        self._changed.set()

    def drain(self) -> None:
        """End every open stream now and every new one at once: the server is shutting
        down, and a stream would hold it up for as long as its job runs. Each client resumes
        with Last-Event-ID (EventSource reconnects by itself), from another API process or
        from this one restarted."""
        self.draining = True
        for subs in self._subs.values():
            for sub in subs:
                sub.wake.set()

    async def close(self) -> None:
        """Stop the hub's task (on application shutdown)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._subs:
            self._changed.clear()
            # Wait past what we have already seen, not past the slowest stream's position:
            # a stream stuck on a slow client must not make this loop spin.
            after = {
                task_id: max(min(s.after for s in subs), self._heads.get(task_id, 0))
                for task_id, subs in self._subs.items()
                if task_id not in self._gone
            }
            if not after:  # (every job followed is gone: until a stream comes or goes)
                await self._changed.wait()
                continue
            waiting = asyncio.ensure_future(
                self.backend.wait_for_events(after, timeout=self.idle_timeout_s)
            )
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({waiting, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                if not waiting.done():
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
            if waiting.cancelled():
                continue
            try:
                grown = waiting.result()
            except Exception as exc:
                if isinstance(exc, BackendError):  # (a lost server: a trace at every retry)
                    log.warning("waiting for events failed; retrying: %s", exc)
                else:
                    log.exception("waiting for events failed; retrying")
                await asyncio.sleep(0.5)
                for subs in self._subs.values():  # let every stream look for itself
                    for sub in subs:
                        sub.wake.set()
                continue
            for task_id, head in grown.items():
                following = self._subs.get(task_id)
                if following is None:
                    continue
                if head == 0:  # the job is gone: each stream sees that when it reads
                    self._gone.add(task_id)
                else:
                    self._heads[task_id] = head
                for sub in following:
                    if sub.after < head or head == 0:
                        sub.wake.set()


def format_event(event: Event) -> str:
    """One SSE message: ``id`` is the event's seq, ``event`` its type, ``data`` the event."""
    payload = json.dumps(event.model_dump(mode="json"), separators=(",", ":"))
    # A type with a line break (ctx.emit refuses one; an older release did not) would end
    # its field, and what follows would read as events of its own.
    kind = event.type.replace("\r", " ").replace("\n", " ")
    return f"id: {event.seq}\nevent: {kind}\ndata: {payload}\n\n"


PAST_THE_LOG_POLL_S = 1.0


async def _wait_past_the_log(
    backend: Backend, task_id: str, after: int, keepalive_s: float
) -> float:
    """How long a resumed stream with nothing new waits for news: ``keepalive_s``, unless its
    ``Last-Event-ID`` is past the job's last event. Only a seq past it wakes the hub for such a
    stream, and none may ever come: such a stream looks at the job again every second, so it
    still ends when the job does, not at a keep-alive up to ``keepalive_s`` later."""
    if await backend.events(task_id, after=after - 1, limit=1):
        return keepalive_s  # (event ``after`` exists: the client is just caught up)
    return min(keepalive_s, PAST_THE_LOG_POLL_S)


async def event_stream(
    hub: EventHub, task_id: str, after: int, *, keepalive_s: float
) -> AsyncIterator[str]:
    """The SSE body: stored events after ``after``, then live ones, until the terminal one.

    It also ends, early, when the server shuts down (``EventHub.drain``) or the backend fails
    mid-stream: the client resumes from its Last-Event-ID, and then gets a proper answer."""
    sub = hub.subscribe(task_id, after)
    try:
        yield "retry: 1000\n\n"
        async for chunk in _follow(hub, sub, keepalive_s):
            yield chunk
    except BackendError as exc:
        log.warning("event stream of %s ended early: the backend failed: %s", task_id, exc)
    finally:
        hub.unsubscribe(sub)


async def _follow(hub: EventHub, sub: Subscription, keepalive_s: float) -> AsyncIterator[str]:
    backend, task_id, after = hub.backend, sub.task_id, sub.after
    wait_s, probed = keepalive_s, after == 0
    while not hub.draining:
        sub.wake.clear()  # before reading, so an event that lands after the read wakes us
        events = await backend.events(task_id, after=sub.after, limit=BATCH)
        for event in events:
            yield format_event(event)
            sub.after = event.seq
        if len(events) == BATCH:
            continue
        if events and is_terminal_event(events[-1]):
            return
        if not events:
            status = await backend.job_status(task_id)  # (not the whole job: a batch's
            if status is None:  # record is every request's input)
                return  # deleted (or expired) meanwhile
            if status.is_terminal:
                # Its terminal event may have landed between our two reads: look again.
                if not await backend.events(task_id, after=sub.after, limit=1):
                    return  # a resumed stream that has already seen the end
                continue
            if not probed:
                probed = True
                wait_s = await _wait_past_the_log(backend, task_id, after, keepalive_s)
        else:
            wait_s, probed = keepalive_s, True  # (the log reaches it)
        if not await wait_set(sub.wake, wait_s) and not hub.draining:
            yield ": keep-alive\n\n"
