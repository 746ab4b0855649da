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
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..aio import wait_set
from ..errors import BackendConnectionError, BackendError, NotPrimaryError, NotReplicatedError

Arg = str | bytes | int | float

log = logging.getLogger("backburner.redis")


def pack_command(args: tuple[Arg, ...]) -> bytes:
    """RESP for one command (hiredis's packer, in C)."""
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # stub: a 1-tuple
    return packed


def pack(commands: Sequence[tuple[Arg, ...]]) -> bytes:
    """RESP for a pipeline of commands, in one buffer."""
    return b"".join(map(pack_command, commands))


IDLE_CHECK_S = 10.0
"""A connection idle longer than this is PINGed before a command goes out on it: a connection
dropped silently while idle (a proxy's idle timeout) is found out while it is still safe to send
on another. A connection Redis closes (a restart) is found out at once by its transport."""

REPLY_TIMEOUT_S = 5.0
"""A Redis that leaves a command unanswered this long has stopped answering: the connection is
dropped and its commands fail with BackendConnectionError."""


FUNCTION_NOT_FOUND = "ERR Function not found"
"""Redis's reply to FCALL of a function it has not loaded (restarted empty, FUNCTION FLUSH)."""


def refused_by_replica(reply: object) -> bool:
    """Whether a reply is a refusal because the Redis is a replica now (READONLY; a script's
    error says so inside)."""
    if not isinstance(reply, ResponseError):
        return False
    message = str(reply)
    return message.startswith("READONLY") or "-READONLY " in message


def moved(reply: object) -> bool:
    """Whether a reply is a Redis Cluster's ``MOVED``: the node does not serve the command's
    slot (now); nothing was done."""
    return isinstance(reply, ResponseError) and str(reply).startswith("MOVED ")


CLUSTER_UNAVAILABLE = ("CLUSTERDOWN", "TRYAGAIN", "ASK ")
"""A Cluster's refusals while it fails over or moves the slot: try again later."""


def _reply_error(message: str) -> ResponseError:
    if message.startswith(("NOSCRIPT", FUNCTION_NOT_FOUND)):
        return NoScriptError(message)
    return ResponseError(message)


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


class _Pipe:
    """One connection: commands are written as they come, replies matched to them in order."""

    def __init__(
        self,
        connection: AbstractConnection,
        where: str,
        reply_timeout_s: float,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """``on_refused``: called with the reply when one says the Redis is a replica now
        (READONLY) or does not serve the keys (a Cluster's MOVED), after this pipe failed its
        commands with NotPrimaryError."""
        self.connection = connection
        self._on_refused = on_refused
        self.where = where
        self.reply_timeout_s = reply_timeout_s
        self.alive = True
        self.retired = False
        """Nothing more is sent on it; it closes once its commands are answered (retire)."""
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self._loop = asyncio.get_running_loop()
        self.last_active = self._loop.time()
        self._parser = hiredis.Reader(replyError=_reply_error)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._progress = self.last_active
        """When the oldest unanswered command was sent, or a reply last came."""
        self._watch_every = min(1.0, reply_timeout_s / 2)
        self._watchdog = self._loop.call_later(self._watch_every, self._watch)
        assert connection._writer is not None
        self._transport = connection._writer.transport  # first: taking over may fail at once
        take_over(connection, self.received, self.fail, where)

    def idle_too_long(self) -> bool:
        return self._loop.time() - self.last_active > IDLE_CHECK_S

    def send(self, args: tuple[Arg, ...]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._loop.create_future()
        if not self.alive:
            future.set_exception(BackendConnectionError(f"Redis at {self.where}: connection lost"))
            return future
        data = pack_command(args)  # first: a command that cannot be packed takes no reply
        idle = not self.waiting
        self.waiting.append(future)
        if idle:
            self._progress = self._loop.time()
        if idle and not self._out:
            # Nothing else is going out: write now rather than a loop turn later (latency).
            self._write(data)
        else:
            self._out.append(data)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.alive:
            out, self._out = self._out, []
            self._write(b"".join(out))

    def _write(self, data: bytes) -> None:
        self._transport.write(data)
        self.last_active = self._loop.time()

    def received(self, data: bytes) -> None:
        """Bytes from Redis: each whole reply goes to the oldest caller waiting."""
        if not self.alive:
            return
        parser, waiting = self._parser, self.waiting
        try:
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                future = waiting.popleft()
                if future.done():  # its caller was cancelled; the command ran all the same
                    continue
                if isinstance(reply, NoScriptError):
                    future.set_exception(reply)
                elif refused_by_replica(reply) or moved(reply):
                    # Each command queued behind it was refused too: none wrote.
                    error = NotPrimaryError(_refusal(self.where, reply))
                    future.set_exception(error)
                    self.fail(error)
                    if self._on_refused is not None:
                        self._on_refused(str(reply))
                    return
                elif isinstance(reply, ResponseError) and str(reply).startswith(
                    CLUSTER_UNAVAILABLE
                ):
                    future.set_exception(
                        BackendConnectionError(f"Redis at {self.where}: {reply} (try again)")
                    )
                elif isinstance(reply, ResponseError):
                    future.set_exception(BackendError(f"Redis refused a command: {reply}"))
                else:
                    future.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:
            self.fail(BackendConnectionError(f"Redis at {self.where}: {exc}"))
            return
        self.last_active = self._progress = self._loop.time()
        if self.retired and not waiting:
            self.fail(BackendError("retired"))  # (nobody waits: fails no one)

    def retire(self) -> None:
        """Send nothing more on it, and close it once the commands sent are answered: a
        command that its Redis refuses there (it is a replica now, or moved the keys) fails
        with NotPrimaryError, which its caller sends again; one it answered is answered."""
        self.retired = True
        if not self.waiting:
            self.fail(BackendError("retired"))

    def _watch(self) -> None:
        # A timer, not a timeout around every read: a read costs nothing extra this way.
        if not self.alive:
            return
        if self.waiting and self._loop.time() - self._progress > self.reply_timeout_s:
            self.fail(
                BackendConnectionError(
                    f"Redis at {self.where}: no reply within {self.reply_timeout_s:g} s"
                )
            )
            return
        self._watchdog = self._loop.call_later(self._watch_every, self._watch)

    def fail(self, error: Exception) -> None:
        """Drop the connection; every command not yet answered fails with ``error``."""
        if not self.alive:
            return
        self.alive = False
        self._watchdog.cancel()
        self._out = []
        waiting = list(self.waiting)
        self.waiting.clear()
        for future in waiting:
            if not future.done():
                future.set_exception(error)
        self._transport.close()
        self.closed.set_result(None)


def _refusal(where: str, reply: object) -> str:
    if moved(reply):
        return (
            f"Redis at {where} does not serve these keys ({reply}): a Redis Cluster is "
            "named by redis+cluster://host:port"
        )
    return f"Redis at {where} is a replica now: {reply}"


def take_over(
    connection: AbstractConnection,
    received: Callable[[bytes], None],
    lost: Callable[[BackendConnectionError], None],
    where: str,
) -> asyncio.WriteTransport:
    """From now on the bytes from ``connection`` go straight to ``received`` (in the loop's
    callback for them) and its loss to ``lost``; returns its transport, to write to.

    redis-py opened the connection (authenticated, selected the db, wrapped it in TLS); past
    that its stream and a task reading it would only stand between the bytes and their reader,
    each costing a loop turn and several coroutine layers per reply. A connection already
    closed is ``lost`` at once; bytes redis-py had buffered are ``received`` at once."""
    assert connection._writer is not None and connection._reader is not None
    transport = connection._writer.transport
    leftover = bytes(connection._reader._buffer)  # type: ignore[attr-defined]
    transport.set_protocol(_TakenOver(received, lost, where, transport.get_protocol()))
    if transport.is_closing() or connection._reader.at_eof():
        # Closed before we took it: our protocol will hear nothing of it.
        lost(BackendConnectionError(f"Redis at {where}: connection closed"))
    elif leftover:
        received(leftover)
    return transport


class _TakenOver(asyncio.Protocol):
    """A connection's protocol once taken over: bytes and loss to their callbacks. The loss is
    also passed on to the protocol redis-py opened it with, so its stream closes (its
    ``wait_closed`` returns) as if it had never been replaced."""

    def __init__(
        self,
        received: Callable[[bytes], None],
        lost: Callable[[BackendConnectionError], None],
        where: str,
        opened_with: asyncio.BaseProtocol,
    ) -> None:
        self._received = received
        self._lost = lost
        self._where = where
        self._opened_with = opened_with

    def data_received(self, data: bytes) -> None:
        self._received(data)

    def eof_received(self) -> bool:
        self._lost(BackendConnectionError(f"Redis at {self._where}: connection closed"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = exc or "Redis closed the connection"
        self._lost(BackendConnectionError(f"Redis at {self._where}: {reason}"))
        self._opened_with.connection_lost(exc)


class _Lane:
    """One of a link's connections: opened when first needed, replaced when lost."""

    def __init__(self, link: RedisLink, extra_reply_s: float = 0.0) -> None:
        """``extra_reply_s``: more time its commands may take to be answered (a lane whose
        commands include WAIT's)."""
        self._link = link
        self._extra_reply_s = extra_reply_s
        self.pipe: _Pipe | None = None
        self._opening: asyncio.Future[_Pipe] | None = None

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

    def _ready_pipe(self) -> _Pipe | None:
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

    async def _usable_pipe(self) -> _Pipe:
        if not self._link.started:
            raise BackendError("the Redis backend is not connected (call connect() first)")
        opening = self._opening
        if opening is None:
            opening = self._opening = asyncio.ensure_future(self._open())
            opening.add_done_callback(self._opened)
        return await asyncio.shield(opening)

    def _opened(self, opening: asyncio.Future[_Pipe]) -> None:
        if self._opening is opening:
            self._opening = None
        if not opening.cancelled():
            opening.exception()  # retrieved: a failure is each waiter's to see, not a warning

    async def _open(self) -> _Pipe:
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
            await connection.disconnect(nowait=True)
            await link.pool.release(connection)
        else:
            raise BackendConnectionError(f"Redis at {link.where}: the primary is moving")
        timeout = link.reply_timeout_s + self._extra_reply_s
        self.pipe = _Pipe(connection, link.where, timeout, link.refused)
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
    ) -> None:
        """``replicas``: how many replicas must confirm a ``replicated`` call's write before
        it is answered (``WAIT``), within ``replica_timeout_ms``."""
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

    def release_when_closed(self, pipe: _Pipe) -> None:
        """Give a retired pipe's connection back to the pool once it has closed (its last
        reply, or its reply timeout, comes first; the link's close, sooner)."""
        task = asyncio.get_running_loop().create_task(self._release_closed(pipe))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _release_closed(self, pipe: _Pipe) -> None:
        try:
            await asyncio.shield(pipe.closed)
        finally:
            pipe.fail(BackendError("the Redis backend is closed"))
            await self.release(pipe)

    async def release(self, pipe: _Pipe) -> None:
        """Close a pipe's connection and give it back to the pool."""
        await pipe.connection.disconnect(nowait=True)
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

    async def call(self, *args: Arg, read_only: bool = False, replicated: bool = False) -> Any:
        """Send one command; its reply, or BackendError. A ``read_only`` command is sent once
        more if the connection breaks under it (a write never is: it may have taken effect),
        and any command once more if a replica refused it (then nothing was written).
        ``replicated``: answer once ``replicas`` replicas have the write (NotReplicatedError if
        they do not confirm it within ``replica_timeout_ms``); with ``replicas`` 0, at once."""
        try:
            return await self._send_one(args, replicated)
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
    ) -> Any:
        """Run a script (as its library's function, or by SHA1), loading it if Redis does
        not know it yet (``read_only`` as for call)."""
        library, function = script.library, script.function
        if self.functions and library is not None and function is not None:
            command: tuple[Arg, ...] = ("FCALL", function, len(keys), *keys, *args)
        else:
            library, command = None, ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await self.call(*command, read_only=read_only, replicated=replicated)
        except NoScriptError:
            if library is not None:  # (FCALL: the library is what Redis lacks)
                await self.load_library(library)
            else:
                await self.call("SCRIPT", "LOAD", script.source)
            if self.on_code_lost is not None:
                self.on_code_lost()
            return await self.call(*command, read_only=read_only, replicated=replicated)

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
        lanes = self._lanes
        lane = lanes[0]
        if len(lanes) > 1 and lane.load():
            lane = min(lanes, key=_Lane.load)
        return lane.send(args)


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
            await connection.disconnect(nowait=True)
            await self._pool.release(connection)
        raise RedisConnectionError("the primary is moving")

    async def drop(self) -> None:
        self._dropped += 1
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
            await wait_set(self._closed, min(5.0, 0.05 * 2**self.failures))  # cut short by close()

    async def close(self, reader: asyncio.Task[None] | None) -> None:
        self.closing = True
        self._closed.set()
        if self.connection is not None:
            await self.connection.disconnect(nowait=True)
        elif reader is not None:
            reader.cancel()  # connecting or backing off, not reading: a cancel is clean
        if reader is not None:
            done, _ = await asyncio.wait({reader}, timeout=1.0)
            if not done:  # a read redis-py did not give up when its connection went
                reader.cancel()
                await asyncio.wait({reader}, timeout=1.0)
