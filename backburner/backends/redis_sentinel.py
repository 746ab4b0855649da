"""The primary that Redis Sentinels name for a ``redis+sentinel://`` backend: asked of them, and
followed through failovers by listening to every one of them (redis_endpoint.py uses this).

Every Sentinel is listened to, not one: the Sentinel that leads a failover announces
``+switch-master`` only once it has reconfigured every replica (5 s after the promotion with two
replicas, here), so a process that listened to the leader alone went on writing to the old
primary, and what it wrote was discarded when the old primary was made a replica (a review lost
a third of the jobs acknowledged in a planned failover's first 7 s). The leader also announces
the replica it is about to promote (``+failover-state-send-slaveof-noone``, about 0.1 s before
it does): new connections go to that replica from then on. It refuses writes (READONLY, which
the link answers with a 503 that says to retry) until it is promoted, so no write that the old
primary acknowledged after that announcement is lost. An address an announcement named is used
for PIN_S; then the Sentinels are asked again (a Sentinel that restarts may repeat an old
announcement), and an aborted failover drops it at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import RedisError

from ..aio import wait_set

log = logging.getLogger("backburner.redis")

Address = tuple[str, int]

POLL_S = 1.0
"""The longest a read of the announcements waits before it looks again whether to stop."""

PIN_S = 15.0
"""How long the primary an announcement named is used without asking the Sentinels: past a
failover's end (the leader names the new primary once every replica follows it, seconds later
with several), short enough that a wrong announcement costs little."""

SWITCH = "+switch-master"
"""``<service> <old ip> <old port> <new ip> <new port>``: the Sentinel names a new primary."""
PROMOTING = "+failover-state-send-slaveof-noone"
"""``slave <ip>:<port> <ip> <port> @ <service> <ip> <port>``: the leader promotes that replica."""
PROMOTED = "+promoted-slave"
"""The same words: the replica reports that it is a primary."""
ABORTED = "-failover-abort-*"
"""``master <service> <ip> <port>`` (a pattern): the failover stopped; the primary stays."""

_ABORT = object()


def announcement(channel: str, data: str, service: str) -> Address | object | None:
    """What a Sentinel's message says of ``service``: its new primary's address, _ABORT (a
    failover of it aborted), or None (another service's, or words this does not know)."""
    words = data.split()
    if channel == SWITCH:
        if len(words) >= 5 and words[0] == service and words[4].isdigit():
            return (words[3], int(words[4]))
    elif channel in (PROMOTING, PROMOTED):
        if len(words) >= 6 and words[4] == "@" and words[5] == service and words[3].isdigit():
            return (words[2], int(words[3]))
    elif channel.startswith("-failover-abort-") and len(words) >= 2 and words[1] == service:
        return _ABORT
    return None


def _short(exc: BaseException) -> str:
    """An error's text without redis-py's reprs of clients and pools."""
    text = str(exc) or type(exc).__name__
    return text.split(" : ", 1)[0].strip()[:200]


class SentinelFollower:
    """The primary of one service, as its Sentinels (redis-py clients, one each) name it."""

    def __init__(self, service: str, sentinels: Sequence[Any], names: Sequence[str]) -> None:
        """``names``: each Sentinel's ``host:port``, for messages."""
        self.service = service
        self._sentinels = list(sentinels)
        self._names = list(names)
        self._first = 0
        """The Sentinel asked first: the last that answered (a hung one costs its timeout
        once, not at every connection)."""
        self.primary: Address | None = None
        """The primary as last named, by an announcement or an answer."""
        self._pinned_until = 0.0

    async def address(self) -> Address:
        """Where new connections go: the primary an announcement named, within PIN_S of it;
        else the one the Sentinels name now (MasterNotFoundError if none does)."""
        if self.primary is not None and time.monotonic() < self._pinned_until:
            return self.primary
        return await self.ask()

    async def ask(self) -> Address:
        """The primary the first Sentinel that answers names (``GET-MASTER-ADDR-BY-NAME``,
        which names the promoted replica as soon as a failover promoted it)."""
        problems: list[str] = []
        count = len(self._sentinels)
        for step in range(count):
            turn = (self._first + step) % count
            try:
                reply = await self._sentinels[turn].execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                )
            except (RedisError, OSError) as exc:
                problems.append(f"{self._names[turn]}: {_short(exc)}")
                continue
            if not reply:
                problems.append(f"{self._names[turn]}: monitors no service {self.service!r}")
                continue
            host, port = reply[0], reply[1]
            host = host.decode() if isinstance(host, bytes) else str(host)
            self._first = turn
            named = (host, int(port))
            if self.primary != named and time.monotonic() >= self._pinned_until:
                self.primary = named
            return named
        raise MasterNotFoundError(
            f"no Sentinel named a primary for {self.service!r} ({'; '.join(problems)})"
        )

    async def follow(self, moved: Callable[[str], Awaitable[None]], closed: asyncio.Event) -> None:
        """Listen to every Sentinel until ``closed``; call ``moved`` (with a description) when
        one names a new primary, or a failover aborts."""
        await asyncio.gather(
            *(self._listen(turn, moved, closed) for turn in range(len(self._sentinels)))
        )

    async def _heard(
        self, named: Address | object, moved: Callable[[str], Awaitable[None]]
    ) -> None:
        if named is _ABORT:
            if time.monotonic() < self._pinned_until:
                self._pinned_until = 0.0
                await moved("a failover was aborted; asking the Sentinels for the primary")
            return
        assert isinstance(named, tuple)
        self._pinned_until = time.monotonic() + PIN_S
        if named != self.primary:
            self.primary = named
            await moved(f"Sentinel named a new primary, {named[0]}:{named[1]}")

    async def _listen(
        self, turn: int, moved: Callable[[str], Awaitable[None]], closed: asyncio.Event
    ) -> None:
        client, name, failures = self._sentinels[turn], self._names[turn], 0
        while not closed.is_set():
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(SWITCH, PROMOTING, PROMOTED)
                await pubsub.psubscribe(ABORTED)
                # A failover announced while nobody here listened is found now, by asking.
                reply = await client.execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                )
                if reply and time.monotonic() >= self._pinned_until:
                    host = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
                    named = (host, int(reply[1]))
                    if self.primary is not None and named != self.primary:
                        self.primary = named
                        await moved(f"Sentinel names a new primary, {host}:{named[1]}")
                    self.primary = named
                failures = 0
                while not closed.is_set():
                    # A bounded wait: redis-py before 8 ends an endless one at the
                    # connection's socket_timeout, as if the Sentinel were gone.
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=POLL_S
                    )
                    if not message or message["type"] not in ("message", "pmessage"):
                        continue
                    channel = message["channel"]
                    channel = channel.decode() if isinstance(channel, bytes) else str(channel)
                    data = message["data"]
                    data = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
                    heard = announcement(channel, data, self.service)
                    if heard is not None:
                        await self._heard(heard, moved)
            except (RedisError, OSError) as exc:
                failures += 1
                log.info("Sentinel at %s: failover announcements lost (%s)", name, _short(exc))
            except Exception:  # a bug: logged, and the watch goes on
                failures += 1
                log.exception("Sentinel at %s: failover announcement not handled", name)
            finally:
                try:
                    await pubsub.aclose()
                except Exception as exc:  # (its connection broke already)
                    log.debug("Sentinel at %s: closing the subscription: %s", name, exc)
            await wait_set(closed, min(5.0, 0.05 * 2**failures))
