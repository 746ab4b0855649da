"""Wake idle workers the moment a job may have become claimable, through Redis Pub/Sub.

Every enqueue, retry, release and replay publishes the job's type on one channel. Each process
keeps one subscription and wakes just its waiters that claim that type. A waiter subscribes
before it looks at the queue, so a job enqueued after the look always wakes it: no polling.

The same connection carries each waiting worker's hand-off channel: an enqueue that finds the
worker registered as idle claims the job for it and publishes it there (``Inbox``), so the
worker starts it without claiming it itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from ..aio import wait_set
from .redis_link import Dedicated
from .redis_pipe import pack, take_over

log = logging.getLogger("backburner.redis")


@dataclass(eq=False)
class _Listener:
    types: frozenset[bytes] | None
    woken: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Inbox:
    """The jobs handed to one worker (as claim returns them), until it takes them."""

    channel: bytes
    docs: list[bytes] = field(default_factory=list)
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)
    unsubscribed: asyncio.Event = field(default_factory=asyncio.Event)
    notify: asyncio.Event | None = None
    """Set when a job arrives (the event of the worker's wait in progress, if any)."""
    deliver: Callable[[bytes], None] | None = None
    """Takes an arriving job at once (during a wait), rather than leaving it in ``docs``."""

    def take(self) -> list[bytes]:
        docs, self.docs = self.docs, []
        return docs


class WakeChannel:
    """One subscription shared by every waiter of a process; resubscribes after errors."""

    def __init__(self, pool: ConnectionPool, channel: str, *, where: str) -> None:
        self._dedicated = Dedicated(pool)
        self._where = where
        self._listeners: set[_Listener] = set()
        self._inboxes: dict[bytes, Inbox] = {}
        self._main = channel.encode()
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._transport: asyncio.WriteTransport | None = None
        """The live session's connection, taken over from redis-py (None: no session)."""

    @contextlib.contextmanager
    def listen(self, types: Sequence[str] | None) -> Iterator[asyncio.Event]:
        """An event set when a job of one of ``types`` (None: any) may be claimable."""
        self._receiving()
        wanted = None if types is None else frozenset(t.encode() for t in types)
        listener = _Listener(wanted)
        self._listeners.add(listener)
        try:
            yield listener.woken
        finally:
            self._listeners.discard(listener)

    async def inbox(self, channel: str) -> Inbox:
        """The inbox of a worker's hand-off channel, subscribed to from now on (until
        ``close_inbox``); wait for ``inbox.subscribed`` before anyone may publish to it."""
        self._receiving()
        key = channel.encode()
        inbox = self._inboxes.get(key)
        if inbox is None:
            inbox = self._inboxes[key] = Inbox(key)
            self._write("SUBSCRIBE", key)  # (no session now: the next subscribes to every inbox)
        return inbox

    async def close_inbox(self, channel: str) -> list[bytes]:
        """Stop listening on a hand-off channel; the jobs that came and were not taken."""
        key = channel.encode()
        inbox = self._inboxes.get(key)
        if inbox is None:
            return []
        if inbox.subscribed.is_set() and self._write("UNSUBSCRIBE", key):
            # One connection: what was published before arrives before the confirmation.
            await wait_set(inbox.unsubscribed, 2.0)
        self._inboxes.pop(key, None)
        return inbox.take()

    def _write(self, *command: str | bytes) -> bool:
        """Send a command on the subscription's connection; False if there is none now."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        transport.write(pack([command]))
        return True

    def _receiving(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._receive(), name="backburner:redis-wake")

    async def ready(self, timeout: float) -> bool:
        """Wait until the subscription is live; False if it is not within ``timeout``."""
        return await wait_set(self._subscribed, timeout)

    async def reconnect(self) -> None:
        """Drop the subscription's connection: it subscribes again on a new one (after a
        failover, on the new primary, where the wake-ups and hand-offs are published)."""
        await self._dedicated.drop()

    async def close(self) -> None:
        await self._dedicated.close(self._task)
        self._task = None
        self._wake_all()

    def _wake_all(self) -> None:
        for listener in self._listeners:
            listener.woken.set()

    async def _receive(self) -> None:
        await self._dedicated.serve(self._session, lost=self._lost, where=self._where)

    async def _session(self, connection: AbstractConnection) -> None:
        # Each message is handled in the loop's callback for its bytes (take_over): a job
        # handed to this worker starts a loop turn sooner than through a reading task.
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        parser = hiredis.Reader()

        def received(data: bytes) -> None:
            try:
                parser.feed(data)
                while (message := parser.gets()) is not False:
                    if isinstance(message, Exception):  # SUBSCRIBE refused (an ACL): retry
                        stopped(message)
                        return
                    try:
                        self._message(*message)
                    except Exception:  # a bug must neither end the session nor go unseen
                        log.exception("Redis at %s: a Pub/Sub message was skipped", self._where)
            except hiredis.ProtocolError as exc:  # a garbled stream: start over
                stopped(exc)

        def stopped(error: Exception) -> None:
            if not lost.done():
                lost.set_exception(RedisConnectionError(str(error)))

        transport = take_over(connection, received, stopped, self._where)
        try:
            self._transport = transport
            self._write("SUBSCRIBE", self._main, *self._inboxes)
            await lost
        finally:
            self._transport = None
            transport.abort()
            # Waiters look again (and see the error) rather than wait for a lost channel; a
            # close_inbox waiting for its confirmation has it (no subscription is left).
            self._subscribed.clear()
            for inbox in self._inboxes.values():
                inbox.subscribed.clear()
                inbox.unsubscribed.set()
            self._wake_all()

    def _message(self, kind: bytes, channel: bytes, data: Any) -> None:
        if kind == b"message" and channel == self._main:
            for listener in self._listeners:
                if listener.types is None or data in listener.types:
                    listener.woken.set()
        elif kind == b"message":
            inbox = self._inboxes.get(channel)
            if inbox is not None:
                self._arrived(inbox, data)
        elif kind == b"unsubscribe" and channel in self._inboxes:
            self._inboxes[channel].unsubscribed.set()
        elif kind == b"subscribe":
            if channel == self._main:
                self._subscribed.set()
                self._dedicated.failures = 0
            elif channel in self._inboxes:
                inbox = self._inboxes[channel]
                inbox.unsubscribed.clear()
                inbox.subscribed.set()

    @staticmethod
    def _arrived(inbox: Inbox, doc: bytes) -> None:
        if inbox.deliver is not None:
            try:
                inbox.deliver(doc)
            except Exception:  # a bug there must not end the subscription: keep it for later
                log.exception("a handed job could not be delivered; kept for the next wait")
                inbox.docs.append(doc)
        else:
            inbox.docs.append(doc)
        if inbox.notify is not None:
            inbox.notify.set()

    def _lost(self, error: Exception) -> None:
        failures = self._dedicated.failures
        if failures <= 3 or failures % 20 == 0:
            log.warning("Redis at %s: wake-up channel lost (%s)", self._where, error)
