"""Calls of one script made in the same event-loop turn go to Redis as one call.

A worker that finishes a hundred jobs in one loop turn, or a producer with 64 enqueues in
flight, calls one script many times at once. Each call costs Redis a script invocation and the
caller a reply of its own; in one call of the script's batch form (``redis_scripts``) they cost
one. A call made while none of the script's calls awaits Redis goes out at once, alone, so a
lone caller waits for nothing. Calls made while one does gather and leave together when the
turn ends. Behind a batch in flight, an ``eager`` batcher sends the first call of the turn at
once, alone, and gathers the turn's later ones: Redis works on that one while the caller's
loop makes the rest. A batch of a gathering (not eager) batcher is written to Redis as its turn
closes it (when a connection is open to take it); an eager one's leaves with the next turn's
commands.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..errors import BackendConnectionError, BackendError, NotPrimaryError
from .redis_link import RedisLink, Script
from .redis_pipe import Arg, refused_by_replica

MAX_BATCH = 200
"""Calls per batch: Redis runs a batch as one script, and serves nobody else meanwhile."""


class ScriptBatcher:
    """Runs one script for many callers: ``await call(args)`` is the script's reply to them."""

    def __init__(
        self,
        link: Callable[[], RedisLink],
        single: Script,
        batched: Script,
        keys: Sequence[Arg],
        prefix: str,
        *,
        max_batch: int = MAX_BATCH,
        eager: bool = False,
        replicated: bool = False,
    ) -> None:
        """``replicated``: each call is answered once the link's replicas have its write
        (RedisLink.call)."""
        self._link = link
        self._replicated = replicated
        self._single = single
        self._batched = batched
        self._keys = tuple(keys)
        self._prefix = prefix
        self._max_batch = max_batch
        self._eager = eager
        self._batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]] | None = None
        """The calls waiting for the end of this loop turn (None: no batch gathering)."""
        self._flush_due = False
        """Whether a flush will close ``_batch`` (not after a lone call: one is made when the
        first call joins it)."""
        self._sending: set[asyncio.Task[None]] = set()
        """The batches flushed and not yet answered."""
        self._alone = 0
        """The calls sent alone and not yet answered."""

    async def call(self, args: tuple[Arg, ...]) -> Any:
        batch = self._batch
        if batch is None or not (batch or self._flush_due):
            alone = not (self._alone or self._sending)
            if alone:
                # Nothing of this script awaits Redis: this call goes at once, alone. The
                # turn's later calls gather, in a batch closed only if one comes: a lone
                # caller's loop is not asked to close one (a loop turn per call).
                self._batch = []
            else:
                # The first behind calls in flight. Its batch is closed when the turn ends; an
                # eager batcher sends this one at once, alone, if the turn opened with it (not
                # behind a lone call, maybe of this turn: those must go out in their order).
                alone = self._eager and batch is None
                if batch is None:
                    self._batch = []
                self._flush_due = True
                asyncio.get_running_loop().call_soon(self._flush)
            if alone:
                self._alone += 1
                try:
                    return await self._link().run(
                        self._single,
                        self._keys,
                        (self._prefix, *args),
                        replicated=self._replicated,
                    )
                finally:
                    self._alone -= 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        assert self._batch is not None
        self._batch.append((args, future))
        if len(self._batch) >= self._max_batch:
            # Full: it leaves now, and the turn's later calls make the next batch (sent by the
            # flush already due at the turn's end). Batches may take either connection, so
            # calls made at once are not ordered among themselves, as without batching.
            self._flush(turn_over=False)
        return await future

    def _flush(self, *, turn_over: bool = True) -> None:
        batch = self._batch
        self._batch = None if turn_over else []
        self._flush_due = not turn_over
        batch = _not_cancelled(batch or [])
        if not batch:
            return
        # A gathering batcher's batch is written now, not by its task's first step: that comes
        # a loop turn later, behind every step of the turn's other tasks, and a worker's
        # finishes left together with the next batches'; Redis and the worker took turns
        # instead of working at once (Redis sat idle a fifth of a drain of no-op jobs). An
        # eager batcher's first call of each turn has gone at once already: its batch leaves
        # with the next turn's commands (written at once, a producer with 64 enqueues in
        # flight was 13-15% slower, in 6 of 6 and 7 of 8 alternating runs).
        written: tuple[RedisLink, list[Arg], asyncio.Future[Any]] | None = None
        if not self._eager:
            try:
                link, flat = self._link(), self._flat(batch)
                sent = link.send_now(self._batched, self._keys, flat, replicated=self._replicated)
            except Exception as exc:  # not connected, or an argument Redis can't take: none went
                for _, future in batch:
                    future.set_exception(exc)
                return
            if sent is not None:
                written = (link, flat, sent)
        task = asyncio.create_task(self._send(batch, written), name="backburner:redis-batch")
        self._sending.add(task)  # in flight from now: a call made before it starts gathers
        task.add_done_callback(functools.partial(self._sent, batch, written))

    def _flat(self, batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]]) -> list[Arg]:
        """The batch form's ARGV: the prefix, the number of calls, then each call's length and
        arguments."""
        flat: list[Arg] = [self._prefix, len(batch)]
        for args, _ in batch:
            flat.append(len(args))
            flat.extend(args)
        return flat

    def _sent(
        self,
        batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]],
        written: tuple[RedisLink, list[Arg], asyncio.Future[Any]] | None,
        task: asyncio.Task[None],
    ) -> None:
        self._sending.discard(task)
        if written is not None:
            sent = written[2]
            if not sent.done():
                sent.cancel()  # (its reply, when it comes, goes to nobody)
            elif not sent.cancelled():
                sent.exception()  # (retrieved: asyncio logs a failure nobody looked at)
        # Cut short (the loop closing, or the batch cancelled before its first step, when its
        # body never runs): no caller waits forever.
        for _, future in batch:
            if not future.done():
                future.set_exception(
                    BackendConnectionError("a batch of calls was cut short; it may have run")
                )

    def _run_batch(
        self,
        flat: list[Arg],
        link: RedisLink | None = None,
        sent: asyncio.Future[Any] | None = None,
    ) -> Awaitable[Any]:
        return (link or self._link()).run(
            self._batched, self._keys, flat, replicated=self._replicated, sent=sent
        )

    async def _send(
        self,
        batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]],
        written: tuple[RedisLink, list[Arg], asyncio.Future[Any]] | None,
    ) -> None:
        link: RedisLink | None = None
        sent: asyncio.Future[Any] | None = None
        if written is None:  # not sent yet: a caller cancelled since its turn ended is not sent
            batch = _not_cancelled(batch)
            if not batch:
                return
            flat = self._flat(batch)
        else:
            # The link that wrote it: a backend closed meanwhile does not read as never sent.
            link, flat, sent = written
        try:
            replies = await self._run_batch(flat, link, sent)
            if isinstance(replies, list) and any(map(refused_by_replica, replies)):
                # (By EVALSHA the batch runs, and each group's write is refused in its place.)
                # Nothing was written: once more, on a new connection, as the link does.
                self._link().refused()
                replies = await self._run_batch(flat)
            if not isinstance(replies, list) or len(replies) != len(batch):
                raise BackendError(f"Redis answered a batch of {len(batch)} calls with {replies!r}")
            for (_, future), reply in zip(batch, replies, strict=True):
                if future.done():  # its caller was cancelled; the call took effect all the same
                    continue
                if refused_by_replica(reply):
                    future.set_exception(NotPrimaryError(f"Redis is a replica now: {reply}"))
                elif isinstance(reply, ResponseError):
                    future.set_exception(BackendError(f"Redis refused a command: {reply}"))
                else:
                    future.set_result(reply)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)


def _not_cancelled(
    batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]],
) -> list[tuple[tuple[Arg, ...], asyncio.Future[Any]]]:
    """The calls of a batch whose callers still wait: one cancelled before its batch left is
    not sent (nothing was done for it)."""
    return [(args, future) for args, future in batch if not future.done()]
