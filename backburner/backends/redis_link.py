"""Pipelined commands to Redis over two connections, however many coroutines send them.

A worker holding 10,000 jobs may finish hundreds of them in one event-loop turn. One connection
per in-flight command would open thousands of sockets; instead every command is written to a
connection the moment it is sent (the commands of one event-loop turn leave in one write), and
the connection's protocol hands each reply to its caller, in order, as its bytes arrive. Nothing
in between: a command costs its caller no task switch but the one for its reply. Each command is
still applied on its own (scripts are atomic; pipelines are not transactions). Blocking commands
(XREAD BLOCK, SUBSCRIBE) never go through here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

from ..aio import wait_set
from ..errors import BackendConnectionError, BackendError, NotPrimaryError, NotReplicatedError
from .redis_pipe import Arg, Pipe, hang_up

log = logging.getLogger("backburner.redis")


REPLY_TIMEOUT_S = 5.0
"""A Redis that leaves a command unanswered this long has stopped answering: the connection is
dropped and its commands fail with BackendConnectionError."""


class Script:
    """A Lua script called by its SHA1, loaded on first use (and again after a Redis restart).

    ``function``: the name of the same script in the Redis Functions library ``library`` (its
    source), called instead by a link whose Redis has loaded that library (RedisLink.functions);
    None for a script that is in no library."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.function: str | None = None
        self.library: str | None = None


class _Lane:
    """One of a link's connections: opened when first needed, replaced when lost."""

    def __init__(self, link: RedisLink, extra_reply_s: float = 0.0) -> None:
        """``extra_reply_s``: more time its commands may take to be answered (a lane whose
        commands include WAIT's)."""
        self._link = link
        self._extra_reply_s = extra_reply_s
        self.pipe: Pipe | None = None
        self._opening: asyncio.Future[Pipe] | None = None

    def load(self) -> int:
        pipe = self.pipe
        return len(pipe.waiting) if pipe is not None and pipe.alive else 0

    def send(self, args: tuple[Arg, ...]) -> Awaitable[Any]:
        """The reply to ``args``: the pipe's future at once when the pipe is usable (no
        coroutine of its own: every command pays for each layer it passes through)."""
        pipe = self._ready_pipe()
        if pipe is None:
            return self._send_on_usable(args)
        return pipe.send(args)

    def send_now(self, args: tuple[Arg, ...]) -> asyncio.Future[Any] | None:
        """The future of ``args``'s reply, the command written before this returns; None if
        the lane has no usable pipe now (none open yet, or retired, or idle too long to use
        unchecked: opening or checking one takes a coroutine)."""
        pipe = self._ready_pipe()
        return None if pipe is None else pipe.send(args, now=True)

    def _ready_pipe(self) -> Pipe | None:
        """Its pipe, if a command may go out on it now (None: open or check one first)."""
        pipe = self.pipe
        if (
            pipe is None
            or not pipe.alive
            or pipe.retired
            or (not pipe.waiting and pipe.idle_too_long())
        ):
            return None
        return pipe

    async def _send_on_usable(self, args: tuple[Arg, ...]) -> Any:
        pipe = await self._usable_pipe()
        return await pipe.send(args)

    async def send_replicated(self, args: tuple[Arg, ...], replicas: int, timeout_ms: int) -> Any:
        """The reply to ``args`` once ``replicas`` replicas have it: ``WAIT`` goes right
        behind it on the same connection (it waits for every write before it there).
        NotReplicatedError if fewer confirm within ``timeout_ms``."""
        pipe = self._ready_pipe() or await self._usable_pipe()
        # WAIT covers the last write this connection made: the script's (a repeated enqueue
        # writes too, so that the first one's write is covered however it went).
        reply, confirmed = pipe.send(args), pipe.send(("WAIT", replicas, timeout_ms))
        try:
            result = await reply
        except BaseException:
            if not confirmed.cancel() and not confirmed.cancelled():
                confirmed.exception()  # (failed with the connection: retrieved, not a warning)
            raise
        count = await confirmed
        if count < replicas:
            raise NotReplicatedError(
                f"Redis at {self._link.where}: written, but {count} of the {replicas} replicas "
                f"asked for confirmed it within {timeout_ms} ms"
            )
        return result

    async def _usable_pipe(self) -> Pipe:
        if not self._link.started:
            raise BackendError("the Redis backend is not connected (call connect() first)")
        opening = self._opening
        if opening is None:
            opening = self._opening = asyncio.ensure_future(self._open())
            opening.add_done_callback(self._opened)
        return await asyncio.shield(opening)

    def _opened(self, opening: asyncio.Future[Pipe]) -> None:
        if self._opening is opening:
            self._opening = None
        if not opening.cancelled():
            opening.exception()  # retrieved: a failure is each waiter's to see, not a warning

    async def _open(self) -> Pipe:
        pipe = self.pipe
        if pipe is not None and pipe.alive and not pipe.retired:
            # Idle a while: make sure it still answers before trusting it with a write.
            try:
                await pipe.send(("PING",))
                return pipe
            except BackendError:
                pass
        await self.drop(BackendError("the Redis backend is closed"), retired_too=False)
        link = self._link
        for _ in range(2):
            generation = link.generation
            try:
                connection = await link.pool.get_connection()  # type: ignore[no-untyped-call]
            except (RedisError, OSError) as exc:
                raise BackendConnectionError(f"Redis at {link.where}: {exc}") from None
            if not link.started:
                await link.pool.release(connection)
                raise BackendError("the Redis backend is closed")
            if generation == link.generation:
                break
            # A failover was announced while it connected: it may have gone to the old
            # primary. Once more (the address is asked again).
            await hang_up(connection)
            await link.pool.release(connection)
        else:
            raise BackendConnectionError(f"Redis at {link.where}: the primary is moving")
        timeout = link.reply_timeout_s + self._extra_reply_s
        self.pipe = Pipe(connection, link.where, timeout, link.refused, link.hands_off)
        return self.pipe

    async def close(self) -> None:
        # A connection still being opened is given up first: opened after the pool closed, it
        # would be left open (a connect that failed mid-way, with others in flight).
        opening = self._opening
        if opening is not None and not opening.done():
            opening.cancel()
            await asyncio.wait({opening})
        await self.drop(BackendError("the Redis backend is closed"))

    async def drop(self, error: Exception, *, retired_too: bool = True) -> None:
        """Drop its connection (the commands awaiting a reply fail with ``error``); the next
        command opens a new one. A retired connection is left to close by itself, unless
        ``retired_too``."""
        pipe, self.pipe = self.pipe, None
        if pipe is None:
            return
        if pipe.retired and pipe.alive and not retired_too:
            self._link.release_when_closed(pipe)
            return
        pipe.fail(error)
        await self._link.release(pipe)


class RedisLink:
    """Send commands; each call is one round trip pipelined with every concurrent caller's.

    Commands go to whichever of ``connections`` connections has the fewest awaiting a reply:
    with two, Redis works on one batch while the replies to the other are being read."""

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        where: str,
        connections: int = 2,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
        hands_off: frozenset[str] = frozenset(),
    ) -> None:
        """``replicas``: how many replicas must confirm a ``replicated`` call's write before
        it is answered (``WAIT``), within ``replica_timeout_ms``. ``hands_off``: the scripts
        (function names and SHA1s) that may hand a job to an idle worker; each pipe sends them
        behind a PING when alone (redis_pipe.HAND_OFF_LEAD)."""
        self.pool = pool
        self.replicas = replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.where = where
        self.reply_timeout_s = reply_timeout_s
        self.started = False
        self.functions = False
        """Scripts go as FCALL of their library's functions (set once the library is loaded)."""
        self.generation = 0
        """How many times every connection was dropped for a failover (reconnect, refused)."""
        self.on_moved: Callable[[str], bool] | None = None
        """Told of each refusal before the connections are retired (refused); returns
        whether it was a Cluster's MOVED, after which new connections go where it says."""
        self.hands_off = hands_off
        self.on_code_lost: Callable[[], None] | None = None
        """Told each time Redis did not know a script and it was loaded again: Redis restarted
        (or its scripts were flushed), and may have lost its keys too."""
        self._lanes = [_Lane(self) for _ in range(max(1, connections))]
        self._retiring: set[asyncio.Task[None]] = set()
        # A client blocked in WAIT has nothing else it sent answered meanwhile: the replicated
        # writes get a connection of their own, so a slow replica holds up only them.
        self._waiting_lane = _Lane(self, extra_reply_s=replica_timeout_ms / 1000)

    def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.started = False
        for lane in (*self._lanes, self._waiting_lane):
            await lane.close()
        closing = list(self._retiring)
        for task in closing:
            task.cancel()
        if closing:
            await asyncio.wait(closing)

    def release_when_closed(self, pipe: Pipe) -> None:
        """Give a retired pipe's connection back to the pool once it has closed (its last
        reply, or its reply timeout, comes first; the link's close, sooner)."""
        task = asyncio.get_running_loop().create_task(self._release_closed(pipe))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _release_closed(self, pipe: Pipe) -> None:
        try:
            await asyncio.shield(pipe.closed)
        finally:
            pipe.fail(BackendError("the Redis backend is closed"))
            await self.release(pipe)

    async def release(self, pipe: Pipe) -> None:
        """Close a pipe's connection and give it back to the pool."""
        await hang_up(pipe.connection)
        await self.pool.release(pipe.connection)

    def refused(self, reply: str = "") -> None:
        """A connection's Redis answered as a replica (or, in a Cluster, as a node that does
        not serve the slot now: MOVED): so would the others', opened before it changed. They
        are retired at once (no other command goes out on them; the next ones go on new
        connections): each of their commands gets its own answer, a refusal sent again by
        its caller. A connection being opened meanwhile is opened again."""
        self.generation += 1
        if self.on_moved is not None:
            self.on_moved(reply)
        for lane in (*self._lanes, self._waiting_lane):
            if lane.pipe is not None:
                lane.pipe.retire()

    async def reconnect(self, reason: str) -> None:
        """Drop every connection: the next commands open new ones (after a failover, to the
        new primary). Commands awaiting a reply fail with BackendConnectionError."""
        self.generation += 1
        error = BackendConnectionError(f"Redis at {self.where}: {reason}")
        for lane in (*self._lanes, self._waiting_lane):
            await lane.drop(error)

    async def call(
        self,
        *args: Arg,
        read_only: bool = False,
        replicated: bool = False,
        sent: asyncio.Future[Any] | None = None,
    ) -> Any:
        """Send one command; its reply, or BackendError. A ``read_only`` command is sent once
        more if the connection breaks under it (a write never is: it may have taken effect),
        and any command once more if a replica refused it (then nothing was written).
        ``replicated``: answer once ``replicas`` replicas have the write (NotReplicatedError if
        they do not confirm it within ``replica_timeout_ms``); with ``replicas`` 0, at once.
        ``sent``: the reply of the command already sent once (send_now), if it was."""
        try:
            return await (sent if sent is not None else self._send_one(args, replicated))
        except NotPrimaryError:
            return await self._send_one(args, replicated)
        except NotReplicatedError:
            raise
        except BackendConnectionError:
            if not read_only:
                raise
            return await self._send_one(args, replicated)

    async def run(
        self,
        script: Script,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        read_only: bool = False,
        replicated: bool = False,
        sent: asyncio.Future[Any] | None = None,
    ) -> Any:
        """Run a script (as its library's function, or by SHA1), loading it if Redis does
        not know it yet (``read_only`` as for call). ``sent``: send_now's future, if the
        script was sent already."""
        library, command = self._script_command(script, keys, args)
        try:
            return await self.call(*command, read_only=read_only, replicated=replicated, sent=sent)
        except NoScriptError:
            if library is not None:  # (FCALL: the library is what Redis lacks)
                await self.load_library(library)
            else:
                await self.call("SCRIPT", "LOAD", script.source)
            if self.on_code_lost is not None:
                self.on_code_lost()
            return await self.call(*command, read_only=read_only, replicated=replicated)

    def send_now(
        self, script: Script, keys: Sequence[Arg], args: Sequence[Arg], *, replicated: bool = False
    ) -> asyncio.Future[Any] | None:
        """Write a call of ``script`` to a connection before this returns, and give the future
        of its reply for ``run``'s ``sent``, which sees to what that reply calls for (loading
        the script, sending it again). A loop callback's command otherwise leaves a turn or two
        later, behind every task step those turns run. None when it cannot go at once: the
        lane it picks has no usable connection now (_Lane.send_now), or ``replicated`` with
        replicas to wait for."""
        if replicated and self.replicas:
            return None
        _, command = self._script_command(script, keys, args)
        return self._lane().send_now(command)

    def _script_command(
        self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]
    ) -> tuple[str | None, tuple[Arg, ...]]:
        """The library to load if Redis lacks the script (None: SCRIPT LOAD it), and the
        command that calls it."""
        library, function = script.library, script.function
        if self.functions and library is not None and function is not None:
            return library, ("FCALL", function, len(keys), *keys, *args)
        return None, ("EVALSHA", script.sha, len(keys), *keys, *args)

    async def load_library(self, source: str) -> None:
        """FUNCTION LOAD a library; one of that name already loaded is the same code (its
        name holds a digest of its source), so that is not an error."""
        try:
            await self.call("FUNCTION", "LOAD", source)
        except BackendError as exc:
            if "already exists" not in str(exc):
                raise

    def _send_one(self, args: tuple[Arg, ...], replicated: bool = False) -> Awaitable[Any]:
        if replicated and self.replicas:
            return self._waiting_lane.send_replicated(args, self.replicas, self.replica_timeout_ms)
        return self._lane().send(args)

    def _lane(self) -> _Lane:
        """The lane for the next command: the first, unless it awaits replies and another
        awaits fewer."""
        lanes = self._lanes
        lane = lanes[0]
        if len(lanes) > 1 and lane.load():
            lane = min(lanes, key=_Lane.load)
        return lane


class Dedicated:
    """A connection of its own for one long-lived reader (a subscription, a blocking read).

    Closing drops the connection first, which ends a pending read with an error, and only then
    waits for the reader: redis-py does not always abandon a cancelled read cleanly. A reader
    still connecting or backing off is cancelled at once.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self.connection: AbstractConnection | None = None
        self.closing = False
        self.failures = 0
        self._dropped = 0
        self._closed = asyncio.Event()

    async def open(self) -> AbstractConnection:
        for _ in range(2):
            dropped = self._dropped
            connection: AbstractConnection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
            if dropped == self._dropped:
                self.connection = connection
                return connection
            # Dropped for a failover while it connected: maybe to the old primary. Again.
            await hang_up(connection)
            await self._pool.release(connection)
        raise RedisConnectionError("the primary is moving")

    async def drop(self) -> None:
        self._dropped += 1
        connection, self.connection = self.connection, None
        if connection is not None:
            await hang_up(connection)
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
            await wait_set(self._closed, min(5.0, 0.05 * 2**self.failures))  # cut short by close()

    async def close(self, reader: asyncio.Task[None] | None) -> None:
        self.closing = True
        self._closed.set()
        if self.connection is not None:
            await hang_up(self.connection)
        elif reader is not None:
            reader.cancel()  # connecting or backing off, not reading: a cancel is clean
        if reader is not None:
            done, _ = await asyncio.wait({reader}, timeout=1.0)
            if not done:  # a read redis-py did not give up when its connection went
                reader.cancel()
                await asyncio.wait({reader}, timeout=1.0)
