"""Wait for new events on many jobs' streams with one XREAD BLOCK per process.

One task owns a connection and keeps an ``XREAD BLOCK`` open on the union of the streams that
waiters follow, from the positions they have seen. A blocked read is never cancelled (redis-py
cannot always abandon a read cleanly, and a dropped connection costs a reconnect): when a
waiter needs a stream that the open read does not cover, ``CLIENT UNBLOCK`` ends that read
early and the task starts another. Waiters give up by timing out on a future of their own.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool

from ..errors import BackendError
from .redis_link import Dedicated, RedisLink
from .redis_pipe import pack

log = logging.getLogger("backburner.redis")

BLOCK_S = 4.0
"""Longest single XREAD BLOCK: well under the 5 s socket timeout, so silence means trouble."""


@dataclass(eq=False)
class _Waiter:
    after: Mapping[str, int]
    done: asyncio.Future[dict[str, int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class StreamWatcher:
    """Shared by every ``wait_for_events`` call of one backend instance."""

    def __init__(self, pool: ConnectionPool, link: RedisLink, prefix: str, *, where: str) -> None:
        self._dedicated = Dedicated(pool)
        self._link = link
        self._prefix = prefix
        self._where = where
        self._waiters: set[_Waiter] = set()
        self._changed = asyncio.Event()
        self._reading: set[str] | None = None  # streams the open XREAD covers
        self._client_id: int | None = None
        self._unblocking: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def wait(self, after: Mapping[str, int], timeout: float) -> dict[str, int]:
        """{task_id: newest seq} for jobs in ``after`` with a newer event; {} after ``timeout``."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="backburner:redis-streams")
        waiter = _Waiter(dict(after))
        self._waiters.add(waiter)
        self._changed.set()
        if self._reading is not None and not set(after) <= self._reading:
            self._unblock()
        try:
            async with asyncio.timeout(timeout):  # (not wait_for: it can lose a cancel, aio.py)
                return await asyncio.shield(waiter.done)
        except TimeoutError:
            if waiter.done.done():  # answered in the turn the time ran out
                return waiter.done.result()
            return {}
        finally:
            self._waiters.discard(waiter)

    async def reconnect(self) -> None:
        """Drop the blocking read's connection: it reads again on a new one (after a
        failover, from the new primary)."""
        await self._dedicated.drop()

    async def close(self) -> None:
        if self._unblocking is not None:
            self._unblocking.cancel()
        self._changed.set()  # a reader with nothing to watch waits on this, not on Redis
        await self._dedicated.close(self._task)
        self._task = self._unblocking = None

    def _unblock(self) -> None:
        if self._unblocking is None or self._unblocking.done():
            self._unblocking = asyncio.create_task(self._send_unblock())

    async def _send_unblock(self) -> None:
        # The UNBLOCK may reach Redis before the XREAD it is meant for: try until one lands
        # or the read has ended by itself.
        while self._reading is not None and self._client_id is not None:
            try:
                if await self._link.call("CLIENT", "UNBLOCK", self._client_id) == 1:
                    return
            except BackendError:
                return
            await asyncio.sleep(0.001)

    async def _run(self) -> None:
        await self._dedicated.serve(self._session, lost=self._lost, where=self._where)

    async def _session(self, connection: AbstractConnection) -> None:
        await connection.send_packed_command(pack([("CLIENT", "ID")]))
        self._client_id = int(await connection.read_response())
        try:
            while not self._dedicated.closing:
                await self._read_once(connection)
                self._dedicated.failures = 0
        finally:
            self._reading = None
            self._client_id = None

    def _lost(self, exc: Exception) -> None:
        error = BackendError(f"Redis at {self._where}: {exc or 'no answer'}")
        for waiter in list(self._waiters):
            if not waiter.done.done():
                waiter.done.set_exception(error)
                waiter.done.exception()  # retrieved: a waiter may have timed out

    async def _read_once(self, connection: AbstractConnection) -> None:
        self._changed.clear()
        positions: dict[str, int] = {}
        for waiter in self._waiters:
            if waiter.done.done():
                continue  # answered; its caller has not yet taken it off the list
            for task_id, seq in waiter.after.items():
                positions[task_id] = min(seq, positions.get(task_id, seq))
        if not positions:
            await self._changed.wait()
            return
        ids = list(positions)
        command: tuple[str | int, ...] = (
            "XREAD",
            "COUNT",
            1,
            "BLOCK",
            int(BLOCK_S * 1000),
            "STREAMS",
            *(f"{self._prefix}e:{task_id}" for task_id in ids),
            *(f"{positions[task_id]}-0" for task_id in ids),
        )
        self._reading = set(ids)
        try:
            await connection.send_packed_command(pack([command]), check_health=False)
            async with asyncio.timeout(BLOCK_S + 5):
                reply: Any = await connection.read_response(
                    timeout=math.inf, disconnect_on_error=False
                )
        finally:
            self._reading = None
        heads: dict[str, int] = {}
        for key, entries in reply or ():
            task_id = key.decode()[len(self._prefix) + 2 :]
            heads[task_id] = int(entries[-1][0].split(b"-", 1)[0])
        for waiter in list(self._waiters):
            grown = {t: s for t, s in heads.items() if t in waiter.after and s > waiter.after[t]}
            if grown and not waiter.done.done():
                waiter.done.set_result(grown)
