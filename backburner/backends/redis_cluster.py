"""A Redis Cluster, as one Redis: the node that serves the deployment's hash slot.

Every key of a deployment carries its prefix's hash tag, so lives in one slot, served by one
primary: the backend talks to that node alone, as to a standalone Redis. Which node that is,
is asked of the nodes the URL names (``redis+cluster://``), in turn: a key command goes to
one, which answers it (it serves the slot) or redirects it (``MOVED <slot> <host>:<port>``,
followed). Every new connection goes to the node found. A failover or a resharding that moves
the slot makes the old node answer ``MOVED``: the link then drops its connections and sends
the command once more (redis_pipe.py, redis_link.py), and new connections go to the node the
reply named. A node that cannot be reached is forgotten, and the next connection asks the named
nodes again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisError

from .urls import ClusterAddress

log = logging.getLogger("backburner.redis")

MAX_REDIRECTS = 5
"""Redirects followed in one search for the slot's node (more: the Cluster is reconfiguring)."""


def moved_to(message: str) -> tuple[str, int] | None:
    """The node a ``MOVED <slot> <host>:<port>`` error names, or None for another error. An
    empty host (a node that does not know its own address) is left empty: the caller keeps
    the host it asked."""
    words = message.split()
    if len(words) != 3 or words[0] != "MOVED":
        return None
    host, colon, port = words[2].rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()):
        return None
    return host.strip("[]"), int(port)


class ClusterNodes:
    """Finds and remembers the node serving one key's slot (``tag_key``: any key of the
    deployment, as they share a slot)."""

    def __init__(self, address: ClusterAddress, tag_key: str) -> None:
        self.address = address
        self.tag_key = tag_key
        self.serving: tuple[str, int] | None = None
        """The node last found to serve the slot (None: ask the named nodes)."""
        self._finding: asyncio.Lock | None = None

    def connection_options(self) -> dict[str, Any]:
        """redis-py connection options for any node: credentials and TLS, and no retries of
        a failed connect (redis-py's default waits seconds between them): a node that cannot
        be reached is forgotten at once, and the next connection asks the others."""
        options: dict[str, Any] = {"username": self.address.username}
        options["password"] = self.address.password
        options["retry"] = Retry(NoBackoff(), 0)
        if self.address.tls and self.address.ssl_ca_certs is not None:
            options["ssl_ca_certs"] = self.address.ssl_ca_certs
        return options

    def connection_class(self) -> type[Connection]:
        """A redis-py connection class whose connections go to the serving node, found first
        if need be."""
        base = SSLConnection if self.address.tls else Connection
        return type("ClusterConnection", (_ToServingNode, base), {"nodes": self})

    async def node(self, **options: Any) -> tuple[str, int]:
        """The node serving the slot: the one found before, or asked for now (``options``:
        the connection's timeouts, for the asking)."""
        serving = self.serving
        if serving is not None:
            return serving
        if self._finding is None:
            self._finding = asyncio.Lock()
        async with self._finding:  # one search, however many connections wait for it
            if self.serving is None:
                self.serving = await self._find(options)
                log.info(
                    "Redis Cluster: the slot of %s is served by %s",
                    self.tag_key,
                    _text(self.serving),
                )
            return self.serving

    def moved(self, message: str) -> bool:
        """A ``MOVED`` error came: new connections go to the node it names. Whether it did
        name one."""
        target = moved_to(message)
        if target is None:
            return False
        host, port = target
        if not host and self.serving is not None:
            host = self.serving[0]
        self.serving = (host, port) if host else None
        return True

    def unreachable(self, node: tuple[str, int]) -> None:
        """A connection to ``node`` failed: the next one asks the named nodes again."""
        if self.serving == node:
            self.serving = None

    async def _find(self, options: dict[str, Any]) -> tuple[str, int]:
        failures: list[str] = []
        for seed in self.address.nodes:
            node, hops = seed, 0
            while True:
                try:
                    answer = await self._ask(node, options)
                except (RedisError, OSError) as exc:
                    failures.append(f"{_text(node)}: {exc}")
                    break
                if answer is None:
                    return node
                hops += 1
                if hops > MAX_REDIRECTS:
                    failures.append(f"{_text(seed)}: more than {MAX_REDIRECTS} redirects")
                    break
                node = (answer[0] or node[0], answer[1])
        raise RedisConnectionError(
            f"no node of the Cluster serves the slot of {self.tag_key} now ({'; '.join(failures)})"
        )

    async def _ask(self, node: tuple[str, int], options: dict[str, Any]) -> tuple[str, int] | None:
        """None if ``node`` serves the slot, else the node it redirects to."""
        timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
        client = Redis(
            host=node[0],
            port=node[1],
            ssl=self.address.tls,
            protocol=2,
            **timeouts,
            **self.connection_options(),
        )
        try:
            await client.execute_command("EXISTS", self.tag_key)  # type: ignore[no-untyped-call]
            return None
        except MovedError as exc:  # (redis-py's reading of "MOVED <slot> <host>:<port>")
            return str(exc.host), int(exc.port)
        finally:
            await client.aclose()


class _ToServingNode(Connection):
    """A connection that goes to the node serving the slot (``nodes``), whatever its pool was
    made with."""

    nodes: ClusterNodes

    async def connect(self) -> None:
        if self.is_connected:
            return
        timeouts = {"socket_timeout": self.socket_timeout}
        timeouts["socket_connect_timeout"] = self.socket_connect_timeout
        node = await self.nodes.node(**timeouts)
        self.host, self.port = node
        try:
            await super().connect()  # type: ignore[no-untyped-call]
        except (RedisError, OSError):
            self.nodes.unreachable(node)
            raise


def _text(node: tuple[str, int]) -> str:
    host, port = node
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
