"""One connection to Redis taken over from redis-py: commands written as they come, replies
matched to them in order by hiredis, in the loop's callback for the bytes (RedisLink's lanes each
hold one; redis_wake and redis_watch take theirs over too)."""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError

from ..errors import BackendConnectionError, BackendError, NotPrimaryError

Arg = str | bytes | int | float


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

HAND_OFF_LEAD = pack_command(("PING",))
"""Sent before a lone script that may publish a job to an idle worker. Redis writes the replies
of an event-loop turn to the last client given one first (its clients_pending_write list is
pushed at the head); a script's reply is given after its PUBLISH, so the producer heard before
the worker, which then waited for a core behind the producer's wake-up. With this PING answered
first the producer is already pending when the script publishes: the worker is written first.
That holds while Redis writes from its main thread (io-threads 1, its default) and reads the
two in one read. An idle worker's pickup p50 went from 1.0-1.4 to 0.8-1.1 ms (bench/peers.py,
scenario c, two series of 3 alternating pairs); a producer whose job is handed off hears about
0.07 ms later."""

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


class Pipe:
    """One connection: commands are written as they come, replies matched to them in order."""

    def __init__(
        self,
        connection: AbstractConnection,
        where: str,
        reply_timeout_s: float,
        on_refused: Callable[[str], None] | None = None,
        hands_off: frozenset[str] = frozenset(),
    ) -> None:
        """``on_refused``: called with the reply when one says the Redis is a replica now
        (READONLY) or does not serve the keys (a Cluster's MOVED), after this pipe failed its
        commands with NotPrimaryError. ``hands_off``: the scripts (function names and SHA1s)
        that may publish a job to an idle worker, sent behind a PING when alone (HAND_OFF_LEAD).
        """
        self.connection = connection
        self._on_refused = on_refused
        self._hands_off = hands_off
        self.where = where
        self.reply_timeout_s = reply_timeout_s
        self.alive = True
        self.retired = False
        """Nothing more is sent on it; it closes once its commands are answered (retire)."""
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting: deque[asyncio.Future[Any] | None] = deque()
        """A future per command sent and not yet answered; None for a HAND_OFF_LEAD's PING."""
        self._loop = asyncio.get_running_loop()
        self.last_active = self._loop.time()
        self._parser = hiredis.Reader(replyError=_reply_error)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._progress = self.last_active
        """When the oldest unanswered command was sent, or a reply last came."""
        self._watch_every = min(1.0, reply_timeout_s / 2)
        # (In a context of its own, as it renews itself: not a copy of a job's, kept for as
        # long as the connection lives.)
        self._watchdog = self._loop.call_later(
            self._watch_every, self._watch, context=contextvars.Context()
        )
        assert connection._writer is not None
        self._transport = connection._writer.transport  # first: taking over may fail at once
        take_over(connection, self.received, self.fail, where)

    def idle_too_long(self) -> bool:
        return self._loop.time() - self.last_active > IDLE_CHECK_S

    def send(self, args: tuple[Arg, ...], *, now: bool = False) -> asyncio.Future[Any]:
        """The future of ``args``'s reply. The command is written at once when nothing else
        awaits a reply, else with the rest of this loop turn's commands at its end; ``now``:
        at once all the same, behind the turn's commands held so far (in one write)."""
        future: asyncio.Future[Any] = self._loop.create_future()
        if not self.alive:
            future.set_exception(BackendConnectionError(f"Redis at {self.where}: connection lost"))
            return future
        data = pack_command(args)  # first: a command that cannot be packed takes no reply
        # (Nothing waiting means nothing to go out either: all in _out is waited for.)
        idle = not self.waiting
        if idle:
            self._progress = self._loop.time()
            if len(args) > 1 and args[1] in self._hands_off:
                self.waiting.append(None)  # the lead's PONG, answered first
                data = HAND_OFF_LEAD + data
        self.waiting.append(future)
        if idle:
            # Nothing else is going out: write now rather than a loop turn later (latency).
            self._write(data)
        elif now:
            self._out.append(data)
            self._write_out()
        else:
            self._out.append(data)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_out()

    def _write_out(self) -> None:
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
                if future is None or future.done():  # a lead's PONG, or a cancelled caller's
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
            if future is not None and not future.done():
                future.set_exception(error)
        self._transport.abort()
        self.closed.set_result(None)


def _refusal(where: str, reply: object) -> str:
    if moved(reply):
        return (
            f"Redis at {where} does not serve these keys ({reply}): a Redis Cluster is "
            "named by redis+cluster://host:port"
        )
    return f"Redis at {where} is a replica now: {reply}"


async def hang_up(connection: AbstractConnection) -> None:
    """Close ``connection`` at once. A TLS connection closed politely sends close_notify and
    stays open until Redis answers: a loop that ends meanwhile (an app's close, then
    asyncio.run's end) finds it still open, and warns of it, on a busy machine."""
    writer = connection._writer
    if writer is not None:
        writer.transport.abort()
    await connection.disconnect(nowait=True)


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
