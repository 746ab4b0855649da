"""One HTTP client per webhook receiver, at most a few connections each, kept while in use.

Requests go to a pinned IP (see ssrf.py), so a connection pool shared by two host names on
one IP could carry one's request over a TLS connection verified for the other: each receiver
(scheme, host, port) gets its own client. httpcore's pool does work per connection for every
request it places, so a few connections per receiver serve best; requests beyond them wait
here, for a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .ssrf import ParsedTarget

if TYPE_CHECKING:  # (imported at the first delivery: a worker that sends none saves 4 MB)
    import httpx

PER_RECEIVER = 8
"""Connections (and requests in flight) to one receiver at a time."""
MAX_IDLE_RECEIVERS = 64
"""Receivers whose connections stay open when they have nothing in flight."""
USER_AGENT = "backburner-webhooks/1"


class ReceiverBusyError(Exception):
    """Every connection to the receiver stayed busy for the whole wait."""


@dataclass(eq=False)
class _Receiver:
    client: httpx.AsyncClient
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PER_RECEIVER))
    busy: int = 0
    """Requests holding or waiting for the gate: a busy receiver's client is never closed."""


class ReceiverPool:
    """The clients of the receivers a dispatcher sends to."""

    def __init__(self, *, timeout_s: float, transport: httpx.AsyncBaseTransport | None) -> None:
        self._timeout_s = timeout_s
        self._transport = transport
        self._receivers: OrderedDict[tuple[str, str, int], _Receiver] = OrderedDict()

    @contextlib.asynccontextmanager
    async def connection(
        self, target: ParsedTarget, *, wait_s: float
    ) -> AsyncIterator[httpx.AsyncClient]:
        """A client for ``target`` with one of its request slots held; ReceiverBusyError if
        none frees up within ``wait_s``."""
        receiver = self._receiver(target)
        receiver.busy += 1
        try:
            try:
                async with asyncio.timeout(wait_s):
                    await receiver.gate.acquire()
            except TimeoutError:
                raise ReceiverBusyError(
                    f"{target.host}: all {PER_RECEIVER} connections busy for {wait_s:g} s"
                ) from None
            try:
                yield receiver.client
            finally:
                receiver.gate.release()
        finally:
            receiver.busy -= 1
            await self._trim()

    def _receiver(self, target: ParsedTarget) -> _Receiver:
        key = (target.scheme, target.host, target.port)
        receiver = self._receivers.get(key)
        if receiver is None:
            import httpx

            client = httpx.AsyncClient(
                transport=self._transport,
                follow_redirects=False,
                timeout=httpx.Timeout(self._timeout_s),
                limits=httpx.Limits(
                    max_connections=PER_RECEIVER, max_keepalive_connections=PER_RECEIVER
                ),
                headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
                trust_env=False,  # a proxy would connect to the host by name, not the pinned IP
            )
            receiver = self._receivers[key] = _Receiver(client)
        self._receivers.move_to_end(key)
        return receiver

    async def _trim(self) -> None:
        """Close the least recently used idle receivers beyond MAX_IDLE_RECEIVERS."""
        idle = [k for k, r in self._receivers.items() if r.busy == 0]
        for key in idle[: max(0, len(self._receivers) - MAX_IDLE_RECEIVERS)]:
            receiver = self._receivers.pop(key)
            await receiver.client.aclose()

    async def aclose(self) -> None:
        receivers, self._receivers = list(self._receivers.values()), OrderedDict()
        for receiver in receivers:
            await receiver.client.aclose()
