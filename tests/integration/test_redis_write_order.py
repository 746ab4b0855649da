"""What redis_pipe.HAND_OFF_LEAD relies on: how Redis orders the writes of one event-loop turn.

A script that PUBLISHes is answered after the message goes to the subscriber, yet Redis writes
the caller's reply first: it writes its pending clients newest first, and the caller joins
them last, with the script's reply. A caller that was given a reply earlier in the same read
(a PING sent with the script) is pending already, so the subscriber is written first.

The order is read from the kernel: each socket's receive time of its bytes (SO_TIMESTAMPNS),
stamped as Redis writes them, in one thread, one after the other. So only where that holds: a
Redis on loopback (no proxy or network card between), writing from its main thread
(io-threads 1, the default), on 64-bit Linux.
"""

from __future__ import annotations

import ipaddress
import platform
import socket
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from urllib.parse import urlsplit

import pytest
from redis import Redis, RedisError

from backburner.backends.redis_pipe import HAND_OFF_LEAD, pack_command

from ..conftest import REDIS_TEST_URL, require_redis

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(
        sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
        reason="SO_TIMESTAMPNS as 64-bit Linux on x86 and ARM define it",
    ),
]

SO_TIMESTAMPNS = 35  # (asm-generic/socket.h; the socket module does not name it)
PUBLISHER = "redis.call('PUBLISH', KEYS[1], ARGV[1]) return 'done'"


@contextmanager
def stamped_connection() -> Iterator[socket.socket]:
    parts = urlsplit(REDIS_TEST_URL)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 5)
    with closing(sock):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        yield sock


def read_until(sock: socket.socket, end: bytes) -> int | None:
    """Read until the bytes end with ``end``; the kernel's receive time (ns) of the last, or
    None if the kernel did not stamp them."""
    received, stamp = b"", None
    while not received.endswith(end):
        data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16))
        assert data, "Redis closed the connection"
        received += data
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                stamp = seconds * 1_000_000_000 + nanoseconds
    return stamp


def until_stamped(*socks: socket.socket) -> None:
    """Until the kernel stamps what they receive: it starts some time after the first socket
    asks (a deferred switch, net_enable_timestamp)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stamps = []
        for sock in socks:
            sock.sendall(pack_command(("PING",)))
            stamps.append(read_until(sock, b"PONG\r\n"))
        if None not in stamps:
            return
    pytest.fail("the kernel gives no receive times (SO_TIMESTAMPNS)")


def require_one_thread_on_loopback() -> None:
    require_redis()
    host = urlsplit(REDIS_TEST_URL).hostname or "127.0.0.1"
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        pytest.skip(f"Redis at {host} is not on loopback")
    try:
        with Redis.from_url(REDIS_TEST_URL) as client:
            threads = client.config_get("io-threads").get("io-threads", "1")
    except RedisError as exc:
        pytest.skip(f"Redis does not say how it writes (CONFIG GET io-threads): {exc}")
    if threads != "1":
        pytest.skip(f"Redis writes from {threads} io-threads")


def subscriber_written_first(lead: bool, rounds: int = 10) -> list[bool]:
    channel = f"write-order-{time.monotonic_ns()}"
    with stamped_connection() as subscriber, stamped_connection() as caller:
        until_stamped(subscriber, caller)
        subscriber.sendall(pack_command(("SUBSCRIBE", channel)))
        read_until(subscriber, b":1\r\n")
        firsts = []
        for n in range(rounds):
            call = pack_command(("EVAL", PUBLISHER, 1, channel, f"job-{n}"))
            caller.sendall(HAND_OFF_LEAD + call if lead else call)
            replied = read_until(caller, b"$4\r\ndone\r\n")
            published = read_until(subscriber, f"job-{n}\r\n".encode())
            assert replied is not None and published is not None
            firsts.append(published < replied)
        return firsts


def test_a_script_alone_has_its_reply_written_before_the_message_it_published() -> None:
    require_one_thread_on_loopback()
    assert subscriber_written_first(lead=False) == [False] * 10


def test_behind_a_ping_the_message_it_published_is_written_first() -> None:
    require_one_thread_on_loopback()
    assert subscriber_written_first(lead=True) == [True] * 10
