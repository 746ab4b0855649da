"""The Redis a backend talks to: one address (``redis://``), the primary its Sentinels name
(``redis+sentinel://``, redis_sentinel.py), asked again for every new connection, or the node of
a Redis Cluster that serves the deployment's slot (``redis+cluster://``, redis_cluster.py).

A failover is acted on when a Sentinel announces it: the backend drops its connections then,
and new ones go to the new primary. Without that, connections to an old primary that is still
up would keep writing to it until Sentinel makes it a replica (up to 10 s later), and those
writes would be lost. A dead primary's connections break by themselves; one made a replica
under a connection gets ``READONLY`` replies, which the link also drops the connection for
(redis_pipe.py, redis_link.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from .redis_cluster import ClusterNodes
from .redis_sentinel import POLL_S, SentinelFollower
from .urls import (
    SentinelAddress,
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
)

log = logging.getLogger("backburner.redis")

SENTINEL_TIMEOUT_S = 2.0
"""The longest a Sentinel may take to accept a connection or answer: it answers from memory, so
one silent this long is hung, and the next is asked (a hung Sentinel listed first cost each
process 5 s, the primary's timeout, at its first connection). Above POLL_S: redis-py before 8
ends a bounded read of the announcements at the socket timeout, as if the Sentinel were gone."""


class _FollowingPool(SentinelConnectionPool):
    """redis-py's pool of connections to a Sentinel service's primary, whose address comes
    from a SentinelFollower: redis-py's own asks ``SENTINEL MASTERS``, whose address is the old
    primary's until the failover's leader has reconfigured every replica."""

    def __init__(self, follower: SentinelFollower, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.follower = follower

    async def get_master_address(self) -> tuple[str, int]:
        address = await self.follower.address()
        if self.master_address != address:
            self.master_address = address
            await self.disconnect(inuse_connections=False)  # (idle ones, to the old one)
        return address


class RedisEndpoint:
    """Makes connection pools for one backend URL and closes what they share."""

    def __init__(self, url: str, tag_key: str = "{bb}:seq") -> None:
        """``tag_key``: a key of the deployment (they share its slot), for a Cluster URL."""
        self.url = url
        self.sentinel: SentinelAddress | None = None
        self.cluster: ClusterNodes | None = None
        self._manager: Any = None
        """The Sentinel client (redis-py's), shared by this endpoint's pools."""
        self._follower: SentinelFollower | None = None
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
            self._follower = SentinelFollower(
                address.service,
                self._manager.sentinels,
                [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in address.sentinels],
            )
        assert self._follower is not None
        return _FollowingPool(
            self._follower,
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
        if self._follower is not None and self._watching is None:
            self._closed = closed = asyncio.Event()
            self._watching = asyncio.create_task(
                self._follower.follow(moved, closed), name="backburner:sentinel"
            )

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
