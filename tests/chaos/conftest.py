"""Fixtures for chaos tests: a backend URL per engine, worker processes, our own Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backburner import Backburner

from .support import Cluster, RedisServer, make_app, ps_leftovers, require_redis_backend

ENGINES = ["sqlite", "redis"]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the tests that do not kill Redis itself (no persistence)."""
    require_redis_backend()
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        assert not ps_leftovers(server.pids), "redis-server left running"


@pytest.fixture(params=ENGINES)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url(f"chaos-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def cluster(backend_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Worker processes; every one of them is killed (and reaped) when the test ends."""
    group = Cluster(backend_url, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()
        left = ps_leftovers(p.pid for p in group.procs)
        assert not left, f"processes left running: {left}"


@pytest.fixture
async def app(backend_url: str) -> AsyncIterator[Backburner]:
    client = make_app(backend_url)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()
