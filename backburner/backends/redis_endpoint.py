"""The Redis a backend talks to: one address (``redis://``), or the primary its Sentinels name
(``redis+sentinel://``), asked again for every new connection.

A failover is acted on when a Sentinel announces it (``+switch-master``): the backend drops its
connections then, and new ones go to the new primary. Without that, connections to an old
primary that is still up would keep writing to it until Sentinel makes it a replica (up to
10 s later), and those writes would be lost. A dead primary's connections break by
themselves; one made a replica under a connection gets ``READONLY`` replies, which the link
also drops the connection for (redis_link.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import ConnectionPool
from redis.exceptions import RedisError

from ..aio import wait_set
from .urls import SentinelAddress, is_sentinel_url, parse_sentinel_url

log = logging.getLogger("backburner.redis")

SWITCH_CHANNEL = "+switch-master"
"""Where Sentinels announce a new primary: ``<service> <old ip> <old port> <new ip> <new port>``."""


class RedisEndpoint:
    """Makes connection pools for one backend URL and closes what they share."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sentinel: SentinelAddress | None = None
        self._manager: Any = None
        """The Sentinel client (redis-py's), shared by this endpoint's pools."""
        self._watching: asyncio.Task[None] | None = None
        self._closed: asyncio.Event | None = None
        self._pubsub: Any = None
        """The subscription to a Sentinel's announcements (redis-py's PubSub), while open."""
        if is_sentinel_url(url):
            self.sentinel = parse_sentinel_url(url)
            self.where = self.sentinel.describe()
        else:
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            self.where = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"

    def pool(self, **options: Any) -> ConnectionPool:
        """A new pool of connections to the primary (``options``: redis-py's connection
        options, such as timeouts)."""
        address = self.sentinel
        if address is None:
            return ConnectionPool.from_url(self.url, **options)
        from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

        tls: dict[str, Any] = {}
        if address.tls:
            tls = {"ssl": True}
            if address.ssl_ca_certs is not None:
                tls["ssl_ca_certs"] = address.ssl_ca_certs
        if self._manager is None:
            sentinel_options = {
                key: value for key, value in options.items() if key.startswith("socket_")
            }
            sentinel_options.update(
                username=address.sentinel_username, password=address.sentinel_password, **tls
            )
            self._manager = Sentinel(address.sentinels, sentinel_kwargs=sentinel_options)
        return SentinelConnectionPool(  # type: ignore[no-untyped-call]
            address.service,
            self._manager,
            db=address.db,
            username=address.username,
            password=address.password,
            **tls,
            **options,
        )

    def watch_failovers(self, moved: Callable[[str], Awaitable[None]]) -> None:
        """For a Sentinel URL, call ``moved`` (with a description) whenever a Sentinel
        announces a new primary for the service, until close(); otherwise nothing."""
        if self.sentinel is not None and self._watching is None:
            self._closed = closed = asyncio.Event()
            self._watching = asyncio.create_task(
                self._watch(moved, closed), name="backburner:sentinel"
            )

    async def _watch(self, moved: Callable[[str], Awaitable[None]], closed: asyncio.Event) -> None:
        assert self.sentinel is not None and self._manager is not None
        service, failures, turn = self.sentinel.service.encode(), 0, 0
        while not closed.is_set():
            sentinels = self._manager.sentinels
            client = sentinels[turn % len(sentinels)]  # the next Sentinel after one fails
            pubsub = self._pubsub = client.pubsub()
            try:
                await pubsub.subscribe(SWITCH_CHANNEL)
                while not closed.is_set():
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                    failures = 0
                    if message is None:
                        continue
                    words = message["data"].split()
                    if words and words[0] == service:
                        new = b":".join(words[3:5]).decode(errors="replace")
                        await moved(f"Sentinel named a new primary, {new} (failover)")
            except (RedisError, OSError) as exc:
                failures, turn = failures + 1, turn + 1
                log.info("Sentinel at %s: failover announcements lost (%s)", client, exc)
            except Exception:  # a bug: logged, and the watch goes on
                failures += 1
                log.exception("Sentinel at %s: failover announcement not handled", client)
            finally:
                self._pubsub = None
                await pubsub.aclose()
            await wait_set(closed, min(5.0, 0.05 * 2**failures))

    async def close(self) -> None:
        """Stop watching for failovers and close the connections to the Sentinels (the pools
        close their own)."""
        if self._closed is not None:
            self._closed.set()
        watching, self._watching = self._watching, None
        if watching is not None:
            # Its connection is closed under it first: redis-py does not always give up a
            # read it is cancelled in (the watch would then read on, and close() wait on it).
            pubsub = self._pubsub
            if pubsub is not None and pubsub.connection is not None:
                await pubsub.connection.disconnect(nowait=True)
            for _ in range(2):
                done, _ = await asyncio.wait({watching}, timeout=1.0)
                if done:
                    break
                watching.cancel()
        manager, self._manager = self._manager, None
        if manager is not None:
            for client in manager.sentinels:
                await client.aclose()
