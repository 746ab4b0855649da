"""The Redis a backend talks to: one address (``redis://``), the primary its Sentinels name
(``redis+sentinel://``), asked again for every new connection, or the node of a Redis Cluster
that serves the deployment's slot (``redis+cluster://``, redis_cluster.py).

A failover is acted on when a Sentinel announces it (``+switch-master``): the backend drops its
connections then, and new ones go to the new primary. Without that, connections to an old
primary that is still up would keep writing to it until Sentinel makes it a replica (up to
10 s later), and those writes would be lost. A dead primary's connections break by
themselves; one made a replica under a connection gets ``READONLY`` replies, which the link
also drops the connection for (redis_pipe.py, redis_link.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import ConnectionPool
from redis.exceptions import RedisError

from ..aio import wait_set
from .redis_cluster import ClusterNodes
from .urls import (
    SentinelAddress,
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
)

log = logging.getLogger("backburner.redis")

POLL_S = 1.0
"""The longest a read of the announcements waits before it looks again whether to stop."""

SENTINEL_TIMEOUT_S = 2.0
"""The longest a Sentinel may take to accept a connection or answer: it answers from memory, so
one silent this long is hung, and the next is asked (a hung Sentinel listed first cost each
process 5 s, the primary's timeout, at its first connection). Above POLL_S: redis-py before 8
ends a bounded read of the announcements at the socket timeout, as if the Sentinel were gone."""

SWITCH_CHANNEL = "+switch-master"
"""Where Sentinels announce a new primary: ``<service> <old ip> <old port> <new ip> <new port>``."""


class RedisEndpoint:
    """Makes connection pools for one backend URL and closes what they share."""

    def __init__(self, url: str, tag_key: str = "{bb}:seq") -> None:
        """``tag_key``: a key of the deployment (they share its slot), for a Cluster URL."""
        self.url = url
        self.sentinel: SentinelAddress | None = None
        self.cluster: ClusterNodes | None = None
        self._manager: Any = None
        """The Sentinel client (redis-py's), shared by this endpoint's pools."""
        self._watching: asyncio.Task[None] | None = None
        self._closed: asyncio.Event | None = None
        if is_sentinel_url(url):
            self.sentinel = parse_sentinel_url(url)
            self.where = self.sentinel.describe()
        elif is_cluster_url(url):
            address = parse_cluster_url(url)
            self.cluster = ClusterNodes(address, tag_key)
            self.where = address.describe()
        else:
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            self.where = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"

    def pool(self, **options: Any) -> ConnectionPool:
        """A new pool of connections to the primary (``options``: redis-py's connection
        options, such as timeouts)."""
        if self.cluster is not None:
            first_host, first_port = self.cluster.address.nodes[0]  # (each connection's own)
            return ConnectionPool(
                connection_class=self.cluster.connection_class(),
                host=first_host,
                port=first_port,
                **self.cluster.connection_options(),
                **options,
            )
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
                socket_timeout=SENTINEL_TIMEOUT_S,
                socket_connect_timeout=SENTINEL_TIMEOUT_S,
                username=address.sentinel_username,
                password=address.sentinel_password,
                **tls,
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

    def redirected(self, message: str) -> bool:
        """A command was answered ``message``, an error: whether it was a Cluster's ``MOVED``,
        after which new connections go to the node it names."""
        return self.cluster is not None and self.cluster.moved(message)

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
        service, failures, turn = self.sentinel.service, 0, 0
        primary: tuple[str, int] | None = None
        """The primary's address as last named."""
        while not closed.is_set():
            sentinels = self._manager.sentinels
            client = sentinels[turn % len(sentinels)]  # the next Sentinel after one fails
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(SWITCH_CHANNEL)
                # A failover announced while nobody here listened is found now, by asking.
                ip, port = await self._manager.discover_master(service)
                named = (str(ip), int(port))
                if primary is not None and named != primary:
                    await moved(f"Sentinel names a new primary, {named[0]}:{named[1]}")
                primary, failures = named, 0
                while not closed.is_set():
                    # A bounded wait: redis-py before 8 ends an endless one at the
                    # connection's socket_timeout, as if the Sentinel were gone.
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=POLL_S
                    )
                    words = message["data"].decode(errors="replace").split() if message else []
                    if len(words) >= 5 and words[0] == service and words[4].isdigit():
                        primary = (words[3], int(words[4]))
                        await moved(f"Sentinel named a new primary, {words[3]}:{words[4]}")
            except (RedisError, OSError) as exc:
                failures, turn = failures + 1, turn + 1
                log.info("Sentinel at %s: failover announcements lost (%s)", client, exc)
            except Exception:  # a bug: logged, and the watch goes on
                failures += 1
                log.exception("Sentinel at %s: failover announcement not handled", client)
            finally:
                try:
                    await pubsub.aclose()
                except Exception as exc:  # (its connection broke already)
                    log.debug("Sentinel at %s: closing the subscription: %s", client, exc)
            await wait_set(closed, min(5.0, 0.05 * 2**failures))

    async def close(self) -> None:
        """Stop watching for failovers and close the connections to the Sentinels (the pools
        close their own)."""
        if self._closed is not None:
            self._closed.set()
        watching, self._watching = self._watching, None
        if watching is not None:
            # (A read redis-py does not give up when cancelled ends within POLL_S, and the
            # watch with it: it looks at ``closed`` after every read.)
            watching.cancel()
            await asyncio.wait({watching}, timeout=2 * POLL_S)
        manager, self._manager = self._manager, None
        if manager is not None:
            for client in manager.sentinels:
                await client.aclose()
