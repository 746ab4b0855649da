"""Shared fixtures: a backend parametrised over every engine, a manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backburner.backends import Backend
from backburner.backends.memory import MemoryBackend
from backburner.backends.sqlite import SQLiteBackend
from backburner.clock import ManualClock

BACKENDS = ["memory", "sqlite"]


def make_backend(kind: str, tmp_path: Path, **options: int | None) -> Backend:
    if kind == "memory":
        return MemoryBackend(**options)
    if kind == "sqlite":
        return SQLiteBackend(str(tmp_path / "jobs.db"), **options)  # type: ignore[arg-type]
    raise ValueError(kind)


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


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
