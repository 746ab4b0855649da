"""Pipelined commands to Redis over a few connections, however many coroutines send them.

A worker holding 10,000 jobs may finish hundreds of them in one event-loop turn. One connection
per in-flight command would open thousands of sockets; instead every command joins a queue and
a few flusher tasks write whatever has gathered as one pipeline, then hand each reply to its
caller. Each command is still applied on its own (scripts are atomic; pipelines are not
transactions). Blocking commands (XREAD BLOCK, SUBSCRIBE) never go through here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..errors import BackendConnectionError, BackendError

Arg = str | bytes | int | float

log = logging.getLogger("backburner.redis")

MAX_BATCH = 512


def _bulk(arg: Arg) -> bytes:
    if isinstance(arg, str):
        data = arg.encode()
    elif isinstance(arg, bytes):
        data = arg
    elif isinstance(arg, int):
        data = b"%d" % arg
    else:
        data = repr(arg).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack(commands: Sequence[tuple[Arg, ...]]) -> bytes:
    """RESP for a pipeline of commands, in one buffer (redis-py's packer costs 3x as much)."""
    out = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        out.extend(map(_bulk, args))
    return b"".join(out)


IDLE_CHECK_S = 1.0
"""A connection idle longer than this is PINGed before a batch goes out on it."""


async def _answers(connection: AbstractConnection) -> bool:
    try:
        await connection.send_packed_command(b"*1\r\n$4\r\nPING\r\n", check_health=False)
        return bool(await connection.read_response(disconnect_on_error=False))
    except (RedisError, OSError):
        return False


class Script:
    """A Lua script called by its SHA1, loaded on first use (and again after a Redis restart)."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class RedisLink:
    """Send commands; each call is one round trip shared with every concurrent caller."""

    def __init__(self, pool: ConnectionPool, *, where: str, connections: int = 2) -> None:
        self._pool = pool
        self._where = where
        self._connections = connections
        self._pending: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]] = []
        self._ready = asyncio.Event()
        self._flushers: list[asyncio.Task[None]] = []
        self._closed = False

    def start(self) -> None:
        if not self._flushers:
            self._closed = False
            self._flushers = [
                asyncio.create_task(self._flush_forever(), name=f"backburner:redis-flush-{i}")
                for i in range(self._connections)
            ]

    async def close(self) -> None:
        self._closed = True
        for task in self._flushers:
            task.cancel()
        await asyncio.gather(*self._flushers, return_exceptions=True)
        self._flushers = []
        self._fail_pending(BackendError("the Redis backend is closed"))

    async def call(self, *args: Arg, read_only: bool = False) -> Any:
        """Send one command; its reply, or BackendError. A ``read_only`` command is sent once
        more if the connection breaks under it (a write never is: it may have taken effect)."""
        try:
            return await self._send_one(args)
        except BackendConnectionError:
            if not read_only:
                raise
            return await self._send_one(args)

    async def run(
        self, script: Script, keys: Sequence[Arg], args: Sequence[Arg], *, read_only: bool = False
    ) -> Any:
        """Run a script by SHA1, loading it if Redis does not know it yet (``read_only`` as
        for call)."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await self.call(*command, read_only=read_only)
        except NoScriptError:
            await self.call("SCRIPT", "LOAD", script.source)
            return await self.call(*command, read_only=read_only)

    async def _send_one(self, args: tuple[Arg, ...]) -> Any:
        if self._closed or not self._flushers:
            raise BackendError("the Redis backend is not connected (call connect() first)")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((args, future))
        self._ready.set()
        return await future

    def _fail_pending(self, error: Exception) -> None:
        pending, self._pending = self._pending, []
        for _, future in pending:
            if not future.done():
                future.set_exception(error)

    async def _flush_forever(self) -> None:
        loop = asyncio.get_running_loop()
        connection: AbstractConnection | None = None
        last_used = loop.time()
        try:
            while True:
                await self._ready.wait()
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                if not self._pending:
                    self._ready.clear()
                if not batch:
                    continue
                try:
                    if connection is None:
                        connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
                    elif loop.time() - last_used > IDLE_CHECK_S and not await _answers(connection):
                        # Dropped while idle (a Redis restart, a proxy's idle timeout): find out
                        # before sending, while it is still safe to send on another connection.
                        await connection.disconnect(nowait=True)  # the send reconnects
                    await self._send(connection, batch)
                    last_used = loop.time()
                except (RedisError, OSError) as exc:
                    error = BackendConnectionError(f"Redis at {self._where}: {exc}")
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    if connection is not None:
                        await connection.disconnect(nowait=True)
                        await self._pool.release(connection)
                        connection = None
        finally:
            if connection is not None:
                await self._pool.release(connection)

    @staticmethod
    async def _send(
        connection: AbstractConnection,
        batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]],
    ) -> None:
        await connection.send_packed_command(pack([args for args, _ in batch]), check_health=False)
        for index, (_, future) in enumerate(batch):
            try:
                reply: Any = await connection.read_response(disconnect_on_error=False)
            except ResponseError as exc:
                reply = exc
            except BaseException:
                # The connection is out of step: the rest of the batch has no reply to read.
                for _, rest in batch[index:]:
                    if not rest.done():
                        rest.set_exception(
                            BackendConnectionError("the Redis connection was lost mid-command")
                        )
                raise
            if future.done():  # the caller was cancelled; its command ran all the same
                continue
            if isinstance(reply, NoScriptError):
                future.set_exception(reply)
            elif isinstance(reply, ResponseError):
                future.set_exception(BackendError(f"Redis refused a command: {reply}"))
            else:
                future.set_result(reply)


class Dedicated:
    """A connection of its own for one long-lived reader (a subscription, a blocking read).

    Closing drops the connection first, which ends a pending read with an error, and only then
    waits for the reader: redis-py does not always abandon a cancelled read cleanly.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self.connection: AbstractConnection | None = None
        self.closing = False
        self.failures = 0

    async def open(self) -> AbstractConnection:
        self.connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        return self.connection

    async def drop(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            await connection.disconnect(nowait=True)
            await self._pool.release(connection)

    async def serve(
        self,
        session: Callable[[AbstractConnection], Awaitable[None]],
        *,
        lost: Callable[[Exception], None],
        where: str,
    ) -> None:
        """Run ``session`` on a connection until close(); after a failure tell ``lost`` and
        run it on a new connection, backing off from 0.1 s to 5 s (a session that works
        resets ``failures`` to 0)."""
        while not self.closing:
            try:
                await session(await self.open())
            except Exception as exc:
                if self.closing:
                    return  # close() dropped the connection under us
                if not isinstance(exc, RedisError | OSError | TimeoutError):
                    log.exception("Redis at %s: unexpected error; reconnecting", where)
                self.failures += 1
                lost(exc)
            finally:
                await self.drop()
            await asyncio.sleep(min(5.0, 0.05 * 2**self.failures))

    async def close(self, reader: asyncio.Task[None] | None) -> None:
        self.closing = True
        if self.connection is not None:
            await self.connection.disconnect(nowait=True)
        if reader is not None:
            done, _ = await asyncio.wait({reader}, timeout=1.0)
            if not done:  # it was sleeping between reconnects, not reading
                reader.cancel()
                await asyncio.wait({reader}, timeout=1.0)
