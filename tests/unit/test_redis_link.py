"""RedisLink: many callers, one connection, each reply to its own caller; failures surface.

Against the real Redis (replies in order under load) and against a scripted loopback server
that can go silent or hang up, to see the link give up and reconnect by itself. Every test runs
on asyncio's event loop and on uvloop's (the CLI's default where installed): the link swaps
the protocol of a transport the loop made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import hiredis
import pytest
from redis.asyncio import ConnectionPool

from backburner.backends.redis_link import Dedicated, RedisLink
from backburner.errors import BackendConnectionError, BackendError

from ..conftest import REDIS_TEST_URL, require_redis
from ._loopback import LoopbackServer

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_event_loops]


@contextlib.asynccontextmanager
async def linked(url: str, **options: Any) -> AsyncIterator[RedisLink]:
    pool = ConnectionPool.from_url(url, protocol=2, socket_connect_timeout=2)
    link = RedisLink(pool, where="test", **options)
    link.start()
    try:
        yield link
    finally:
        await link.close()
        await pool.disconnect()


class ScriptedServer(LoopbackServer):
    """Answers every command with +OK (or its name, with ``echo_names``), until told to stay
    silent or to hang up on the next."""

    def __init__(self, *, echo_names: bool = False) -> None:
        super().__init__()
        self.echo_names = echo_names
        self.silent = False
        self.hang_up_on: bytes | None = None
        self.received: list[list[bytes]] = []
        self.connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        parser = hiredis.Reader()
        try:
            while data := await reader.read(1 << 16):
                parser.feed(data)
                while (command := parser.gets()) is not False:
                    self.received.append(command)
                    if self.hang_up_on is not None and command[0] == self.hang_up_on:
                        self.hang_up_on = None
                        writer.close()
                        return
                    if not self.silent:
                        writer.write(b"+%s\r\n" % (command[0] if self.echo_names else b"OK"))
        except ConnectionError:
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("connections", [1, 2])
async def test_concurrent_callers_each_get_their_own_reply_over_few_connections(
    connections: int,
) -> None:
    require_redis()
    async with linked(REDIS_TEST_URL, connections=connections) as link:
        assert await link.call("PING") == b"PONG"
        replies = await asyncio.gather(
            *(link.call("ECHO", f"value-{i}", read_only=True) for i in range(3000))
        )
        assert replies == [f"value-{i}".encode() for i in range(3000)]
        opened = [lane.pipe for lane in link._lanes if lane.pipe is not None]
        assert len(opened) == connections  # every lane carried commands


async def test_a_command_sent_now_is_written_at_once_behind_the_turns_earlier_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with ScriptedServer(echo_names=True) as server, linked(server.url, connections=1) as link:
        assert await link.call("PING") == b"PING"  # open
        pipe = link._lanes[0].pipe
        assert pipe is not None
        writes: list[bytes] = []
        write = pipe._write

        def recorded(data: bytes) -> None:
            writes.append(data)
            write(data)

        monkeypatch.setattr(pipe, "_write", recorded)
        first = link._send_one(("FIRST",))  # nothing awaits a reply: written at once
        second = link._send_one(("SECOND",))  # behind it: held for the turn's end
        assert writes == [b"*1\r\n$5\r\nFIRST\r\n"]
        third = link._lanes[0].send_now(("THIRD",))
        # Written before send_now returned, the held one first: the replies stay in order.
        assert writes[1:] == [b"*1\r\n$6\r\nSECOND\r\n*1\r\n$5\r\nTHIRD\r\n"]
        assert third is not None
        assert [await first, await second, await third] == [b"FIRST", b"SECOND", b"THIRD"]
        assert server.received[-3:] == [[b"FIRST"], [b"SECOND"], [b"THIRD"]]
        assert len(writes) == 2  # the turn's end found nothing left to write


async def test_a_lane_without_an_open_connection_sends_nothing_now() -> None:
    async with ScriptedServer() as server, linked(server.url) as link:
        assert link._lanes[0].send_now(("PING",)) is None  # opening one takes a coroutine
        assert server.received == []
        assert await link.call("PING") == b"OK"
        sent = link._lanes[0].send_now(("PING",))
        assert sent is not None and await sent == b"OK"


async def test_a_cancelled_caller_does_not_shift_the_replies_of_the_others() -> None:
    require_redis()
    async with linked(REDIS_TEST_URL, connections=1) as link:
        assert await link.call("PING") == b"PONG"  # open: a command is written when sent
        abandoned = asyncio.create_task(link.call("ECHO", "abandoned", read_only=True))
        await asyncio.sleep(0)  # written
        abandoned.cancel()
        assert link._lanes[0].load() == 1  # its reply is still to come
        assert await link.call("ECHO", "mine", read_only=True) == b"mine"
        assert abandoned.cancelled()


async def test_a_refused_command_fails_only_its_caller() -> None:
    require_redis()
    async with linked(REDIS_TEST_URL) as link:
        bad = link.call("NOSUCHCOMMAND", "x")
        good = link.call("ECHO", "fine", read_only=True)
        results = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(results[0], BackendError)
        assert "refused" in str(results[0])
        assert results[1] == b"fine"


async def test_a_silent_server_fails_the_command_after_the_reply_timeout() -> None:
    async with ScriptedServer() as server, linked(server.url, reply_timeout_s=0.3) as link:
        assert await link.call("PING") == b"OK"
        server.silent = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BackendConnectionError, match=r"no reply within 0\.3 s"):
            await link.call("SET", "k", "v")
        assert 0.3 <= loop.time() - started < 3.0
        server.silent = False
        assert await link.call("PING") == b"OK"  # on a new connection
        assert server.connections == 2


async def test_a_hang_up_fails_a_write_but_resends_a_read_on_a_new_connection() -> None:
    async with ScriptedServer() as server, linked(server.url) as link:
        assert await link.call("PING") == b"OK"
        server.hang_up_on = b"SET"
        with pytest.raises(BackendConnectionError):
            await link.call("SET", "k", "v")  # a write is never sent twice: it may have landed
        assert sum(1 for c in server.received if c[0] == b"SET") == 1
        server.hang_up_on = b"GET"
        assert await link.call("GET", "k", read_only=True) == b"OK"
        assert sum(1 for c in server.received if c[0] == b"GET") == 2
        assert server.connections == 3


async def test_a_closed_link_refuses_commands() -> None:
    async with ScriptedServer() as server, linked(server.url) as link:
        assert await link.call("PING") == b"OK"
    with pytest.raises(BackendError, match="not connected"):
        await link.call("PING")


async def test_redis_py_still_sees_the_connection_close_after_the_link_took_it() -> None:
    require_redis()
    async with linked(REDIS_TEST_URL) as link:
        assert await link.call("PING") == b"PONG"
        pipe = link._lanes[0].pipe
        assert pipe is not None
        # Without the loss passed on to redis-py's own protocol, its stream never closes and
        # a disconnect that waits for it times out.
        await asyncio.wait_for(pipe.connection.disconnect(), 2)
        assert not pipe.alive


async def test_closing_a_reader_still_connecting_returns_at_once() -> None:
    """A dedicated reader whose connection is not made yet (here: its SELECT unanswered) is
    cancelled by close(), not waited for."""
    async with ScriptedServer() as server:
        server.silent = True
        url = f"redis://127.0.0.1:{server.port}/1"  # db 1: connecting sends SELECT
        pool = ConnectionPool.from_url(url, protocol=2, socket_connect_timeout=2)
        dedicated = Dedicated(pool)
        sessions: list[object] = []

        async def session(connection: object) -> None:
            sessions.append(connection)

        reader = asyncio.create_task(dedicated.serve(session, lost=lambda _: None, where="t"))
        try:
            while not any(c[0] == b"SELECT" for c in server.received):
                await asyncio.sleep(0.01)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await dedicated.close(reader)
            assert loop.time() - started < 0.5  # not close's 1 s wait for a reader
            assert reader.done() and sessions == []
        finally:
            reader.cancel()
            await pool.disconnect()


HAND_OFF = frozenset({"lib_enqueue", "0123abcd"})


@contextlib.asynccontextmanager
async def hand_off_link() -> AsyncIterator[tuple[ScriptedServer, RedisLink]]:
    """A one-connection link to a server echoing command names, its connection open and what
    the server received so far forgotten."""
    async with (
        ScriptedServer(echo_names=True) as server,
        linked(server.url, connections=1, hands_off=HAND_OFF) as link,
    ):
        await link.call("GET", "open", read_only=True)
        server.received.clear()
        yield server, link


async def test_a_lone_hand_off_script_goes_behind_a_ping_whose_reply_nobody_gets() -> None:
    async with hand_off_link() as (server, link):
        assert await link.call("FCALL", "lib_enqueue", 0) == b"FCALL"
        assert await link.call("EVALSHA", "0123abcd", 0) == b"EVALSHA"
        assert await link.call("FCALL", "lib_finish", 0) == b"FCALL"
        assert await link.call("GET", "k", read_only=True) == b"GET"
        assert [c[:2] for c in server.received] == [
            [b"PING"],
            [b"FCALL", b"lib_enqueue"],
            [b"PING"],
            [b"EVALSHA", b"0123abcd"],
            [b"FCALL", b"lib_finish"],
            [b"GET", b"k"],
        ]
        assert link._lanes[0].load() == 0  # the PONGs were taken off too


async def test_a_hand_off_script_behind_commands_in_flight_goes_without_a_ping() -> None:
    """Only a lone one is led: behind others in flight it is not the latency-bound case."""
    async with hand_off_link() as (server, link):
        replies = await asyncio.gather(
            link.call("FCALL", "lib_enqueue", 0),
            link.call("FCALL", "lib_enqueue", 0),
            link.call("ECHO", "x", read_only=True),
        )
        assert replies == [b"FCALL", b"FCALL", b"ECHO"]
        assert [c[0] for c in server.received] == [b"PING", b"FCALL", b"FCALL", b"ECHO"]


async def test_a_hang_up_before_the_lead_is_answered_fails_the_script_alone() -> None:
    async with hand_off_link() as (server, link):
        server.hang_up_on = b"PING"
        with pytest.raises(BackendConnectionError):
            await link.call("FCALL", "lib_enqueue", 0)
        assert await link.call("GET", "k", read_only=True) == b"GET"  # on a new connection
        assert server.connections == 2
