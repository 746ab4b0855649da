"""WakeChannel: the process's one subscription, read in the loop's callback for its bytes.

Against a scripted loopback Pub/Sub server that confirms subscriptions, publishes when told
and can garble its stream or hang up: the channel wakes its listeners, hands jobs to inboxes,
and after a broken stream starts a new session that subscribes to every inbox again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import hiredis
import pytest
from redis.asyncio import ConnectionPool

from backburner.aio import wait_set
from backburner.backends.redis_pipe import pack
from backburner.backends.redis_wake import Inbox, WakeChannel

from ._loopback import LoopbackServer

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_event_loops]

MAIN = "{bb}:wake"


class PubSubServer(LoopbackServer):
    """Confirms SUBSCRIBE and UNSUBSCRIBE per channel; ``publish`` and ``garble`` write to the
    latest connection."""

    def __init__(self) -> None:
        super().__init__()
        self.subscribes: list[list[bytes]] = []
        self.connections = 0
        self.subscribed = asyncio.Event()
        self.hang_up_on_unsubscribe = False
        self._writer: asyncio.StreamWriter | None = None

    def publish(self, channel: str, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(_push(b"message", channel.encode(), data))

    def garble(self) -> None:
        assert self._writer is not None
        self._writer.write(b"?this is not RESP\r\n")

    def send(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writer = writer
        parser = hiredis.Reader()
        try:
            while data := await reader.read(1 << 16):
                parser.feed(data)
                while (command := parser.gets()) is not False:
                    name, channels = command[0].upper(), command[1:]
                    if name == b"SUBSCRIBE":
                        self.subscribes.append(channels)
                        for count, channel in enumerate(channels, 1):
                            writer.write(_push(b"subscribe", channel, count))
                        self.subscribed.set()
                    elif name == b"UNSUBSCRIBE" and self.hang_up_on_unsubscribe:
                        return
                    elif name == b"UNSUBSCRIBE":
                        for channel in channels:
                            writer.write(_push(b"unsubscribe", channel, 0))
                    else:
                        writer.write(b"+OK\r\n")
        except ConnectionError:
            pass
        finally:
            writer.close()


def _push(kind: bytes, channel: bytes, data: bytes | int) -> bytes:
    if isinstance(data, int):
        return b"*3\r\n" + pack([(kind, channel)])[4:] + b":%d\r\n" % data
    return pack([(kind, channel, data)])


async def arrived(inbox: Inbox) -> None:
    """Until a job reaches ``inbox`` (polled, with a generous deadline)."""
    for _ in range(1000):
        if inbox.docs:
            return
        await asyncio.sleep(0.01)
    pytest.fail("nothing reached the inbox")


@contextlib.asynccontextmanager
async def channel(server: PubSubServer) -> AsyncIterator[WakeChannel]:
    pool = ConnectionPool.from_url(server.url, protocol=2, socket_connect_timeout=2)
    wake = WakeChannel(pool, MAIN, where="test")
    try:
        yield wake
    finally:
        await wake.close()
        await pool.disconnect()


async def test_messages_wake_listeners_and_reach_inboxes() -> None:
    async with PubSubServer() as server, channel(server) as wake:
        inbox = await wake.inbox("{bb}:hand:w1")
        with wake.listen(["noop"]) as woken:
            assert await wake.ready(5)
            assert await wait_set(inbox.subscribed, 5)
            server.publish(MAIN, b"other")  # a type this listener does not claim
            server.publish("{bb}:hand:w1", b'{"task_id":"t1"}')
            await arrived(inbox)  # and so did "other", which came first on the connection
            assert not woken.is_set()
            assert inbox.take() == [b'{"task_id":"t1"}']
            server.publish(MAIN, b"noop")
            assert await wait_set(woken, 5)
        assert await wake.close_inbox("{bb}:hand:w1") == []
        assert inbox.unsubscribed.is_set()


async def test_a_garbled_stream_starts_a_session_that_subscribes_to_every_inbox_again() -> None:
    async with PubSubServer() as server, channel(server) as wake:
        inbox = await wake.inbox("{bb}:hand:w1")
        assert await wake.ready(5) and await wait_set(inbox.subscribed, 5)
        first = server.connections
        server.subscribed.clear()
        with wake.listen(None) as woken:
            server.garble()
            assert await wait_set(woken, 5)  # listeners look again rather than wait on
        assert await wait_set(server.subscribed, 10)  # after the reconnect's back-off
        assert server.connections == first + 1
        assert server.subscribes[-1] == [MAIN.encode(), b"{bb}:hand:w1"]
        assert await wake.ready(5) and await wait_set(inbox.subscribed, 5)
        server.publish("{bb}:hand:w1", b'{"task_id":"t2"}')
        await arrived(inbox)
        assert inbox.take() == [b'{"task_id":"t2"}']


async def test_close_ends_the_session_at_once() -> None:
    async with PubSubServer() as server:
        pool = ConnectionPool.from_url(server.url, protocol=2, socket_connect_timeout=2)
        wake = WakeChannel(pool, MAIN, where="test")
        with wake.listen(None):
            assert await wake.ready(5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await wake.close()
        assert loop.time() - started < 0.5  # the session ended; close did not wait on it
        await pool.disconnect()


async def test_a_message_that_cannot_be_handled_is_logged_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with PubSubServer() as server, channel(server) as wake:
        inbox = await wake.inbox("{bb}:hand:w1")
        assert await wake.ready(5) and await wait_set(inbox.subscribed, 5)
        server.send(b"*2\r\n$7\r\nmessage\r\n$1\r\nx\r\n")  # no data: not a message
        server.publish("{bb}:hand:w1", b'{"task_id":"t3"}')
        await arrived(inbox)  # the same session carried on
        assert inbox.take() == [b'{"task_id":"t3"}']
        assert server.connections == 1
        assert "a Pub/Sub message was skipped" in caplog.text


async def test_closing_an_inbox_does_not_wait_on_a_session_that_is_gone() -> None:
    async with PubSubServer() as server, channel(server) as wake:
        inbox = await wake.inbox("{bb}:hand:w1")
        assert await wake.ready(5) and await wait_set(inbox.subscribed, 5)
        server.hang_up_on_unsubscribe = True  # its confirmation will never come
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await wake.close_inbox("{bb}:hand:w1") == []
        assert loop.time() - started < 1.0  # not the 2 s wait for a confirmation
