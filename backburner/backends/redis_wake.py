"""Wake idle workers the moment a job may have become claimable, through Redis Pub/Sub.

Every enqueue, retry, release and replay publishes the job's type on one channel. Each process
keeps one subscription and wakes just its waiters that claim that type. A waiter subscribes
before it looks at the queue, so a job enqueued after the look always wakes it: no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from redis.asyncio.connection import AbstractConnection, ConnectionPool

from .redis_link import Dedicated, pack

log = logging.getLogger("backburner.redis")


@dataclass(eq=False)
class _Listener:
    types: frozenset[bytes] | None
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class WakeChannel:
    """One subscription shared by every waiter of a process; resubscribes after errors."""

    def __init__(self, pool: ConnectionPool, channel: str, *, where: str) -> None:
        self._dedicated = Dedicated(pool)
        self._channel = channel
        self._where = where
        self._listeners: set[_Listener] = set()
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def listen(self, types: Sequence[str] | None) -> Iterator[asyncio.Event]:
        """An event set when a job of one of ``types`` (None: any) may be claimable."""
        if self._task is None:
            self._task = asyncio.create_task(self._receive(), name="backburner:redis-wake")
        wanted = None if types is None else frozenset(t.encode() for t in types)
        listener = _Listener(wanted)
        self._listeners.add(listener)
        try:
            yield listener.woken
        finally:
            self._listeners.discard(listener)

    async def ready(self, timeout: float) -> bool:
        """Wait until the subscription is live; False if it is not within ``timeout``."""
        if self._subscribed.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        return self._subscribed.is_set()

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
        await connection.send_packed_command(pack([("SUBSCRIBE", self._channel)]))
        try:
            while True:
                kind, _, data = await connection.read_response(
                    timeout=math.inf, disconnect_on_error=False
                )
                if kind == b"subscribe":
                    self._subscribed.set()
                    self._dedicated.failures = 0
                elif kind == b"message":
                    for listener in self._listeners:
                        if listener.types is None or data in listener.types:
                            listener.woken.set()
        finally:
            # Waiters look again (and see the error) rather than wait for a lost channel.
            self._subscribed.clear()
            self._wake_all()

    def _lost(self, error: Exception) -> None:
        failures = self._dedicated.failures
        if failures <= 3 or failures % 20 == 0:
            log.warning("Redis at %s: wake-up channel lost (%s)", self._where, error)
