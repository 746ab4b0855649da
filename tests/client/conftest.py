"""Fixtures: the real app in-process (ASGI), and a real uvicorn server shared by a module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from backburner.client import AsyncClient
from tests.live_server import LiveServer, live_server

from .support import make_app


@pytest.fixture
async def app() -> AsyncIterator[Any]:
    application = make_app()
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def aclient(app: Any) -> AsyncIterator[AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient("http://testserver", transport=transport, poll_interval=0.05) as c:
        yield c


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("server")) as running:
        yield running
