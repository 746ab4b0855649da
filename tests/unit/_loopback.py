"""A RESP server on a loopback port for the Redis connection tests: subclasses answer."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self


class LoopbackServer:
    """Listens on 127.0.0.1 (a free port) inside ``async with``; ``_serve`` answers a
    connection."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
