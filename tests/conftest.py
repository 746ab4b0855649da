"""Shared fixtures: a backend parametrised over every engine, a manual clock."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from backburner.backends import Backend
from backburner.backends.memory import MemoryBackend
from backburner.backends.redis import RedisBackend, delete_all_keys
from backburner.backends.sqlite import SQLiteBackend
from backburner.clock import ManualClock

BACKENDS = ["memory", "sqlite", "redis"]


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
    """A test marked ``both_event_loops`` runs on asyncio's loop and on uvloop's (the CLI's
    default where installed); the others on asyncio's."""
    if item.get_closest_marker("both_event_loops") and uvloop_installed():
        import uvloop

        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


def uvloop_installed() -> bool:
    """uvloop comes with backburner except where it does not run (Windows, PyPy)."""
    return importlib.util.find_spec("uvloop") is not None


REDIS_TEST_URL = os.environ.get("BACKBURNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
"""The shared Redis the tests use: database 15, each test under its own key prefix."""


def redis_available() -> bool:
    """True if a Redis answers at REDIS_TEST_URL; in CI (CI=true) a missing Redis is a failure."""
    parts = urlsplit(REDIS_TEST_URL)
    try:
        with socket.create_connection((parts.hostname, parts.port or 6379), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            answered = sock.recv(16).startswith(b"+PONG")
    except OSError:
        answered = False
    if not answered and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but no Redis answers at {REDIS_TEST_URL}")
    return answered


def require_redis() -> None:
    if not redis_available():
        pytest.skip(f"no Redis answers at {REDIS_TEST_URL}")


def make_backend(kind: str, tmp_path: Path, **options: int | None) -> Backend:
    if kind == "memory":
        return MemoryBackend(**options)
    if kind == "sqlite":
        return SQLiteBackend(str(tmp_path / "jobs.db"), **options)  # type: ignore[arg-type]
    if kind == "redis":
        require_redis()
        prefix = "test-" + uuid.uuid4().hex[:12]
        return RedisBackend(REDIS_TEST_URL, prefix=prefix, **options)  # type: ignore[arg-type]
    raise ValueError(kind)


async def drop_redis_keys(engine: Backend) -> None:
    """Delete every key under a test backend's prefix (tests never flush the database)."""
    if isinstance(engine, RedisBackend):
        await delete_all_keys(REDIS_TEST_URL, engine.prefix)


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def backend(backend_kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    engine = make_backend(backend_kind, tmp_path)
    await engine.connect()
    try:
        yield engine
    finally:
        await engine.close()
        await drop_redis_keys(engine)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["sqlite", "redis"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A backend URL that processes can share: a SQLite file, or a fresh prefix on Redis."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    require_redis()
    prefix = "test-" + uuid.uuid4().hex[:12]
    yield f"{REDIS_TEST_URL}?prefix={prefix}"
    await drop_redis_keys(RedisBackend(REDIS_TEST_URL, prefix=prefix))
