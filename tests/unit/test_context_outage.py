"""A handler's event writes ride out a backend outage, and a write whose reply was lost is not
made twice."""

from __future__ import annotations

from typing import Any

import pytest

from backburner.backends.memory import MemoryBackend
from backburner.clock import SystemClock
from backburner.context import JobContext
from backburner.errors import BackendConnectionError
from tests.conformance._support import LEASE, T0, new_job


class _Flaky:
    """The memory backend, with its next ``fail`` appends broken: before the write
    (``landed`` False) or after it, the reply lost (True)."""

    def __init__(self, backend: MemoryBackend, fail: int, *, landed: bool) -> None:
        self._backend = backend
        self.fail = fail
        self.landed = landed

    async def append_event(self, *args: Any, **kwargs: Any) -> int:
        if self.fail > 0:
            self.fail -= 1
            if self.landed:
                await self._backend.append_event(*args, **kwargs)
            raise BackendConnectionError("Redis at 127.0.0.1:1: connection reset by peer")
        return await self._backend.append_event(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


async def _running(backend: MemoryBackend) -> Any:
    await backend.enqueue(new_job())
    (job,) = await backend.claim("w1", limit=1, now=T0, lease_s=LEASE)
    return job


@pytest.mark.parametrize("landed", [False, True])
async def test_an_event_write_rides_out_an_outage_and_is_written_once(landed: bool) -> None:
    # A Redis restart failed the attempt of every job that wrote an event meanwhile (a
    # review: 30 of 30 generations dead-lettered after 3 restarts).
    backend = MemoryBackend()
    job = await _running(backend)
    flaky = _Flaky(backend, 3, landed=landed)
    ctx = JobContext(job, flaky, SystemClock(), ride_out_s=10)  # type: ignore[arg-type]
    first = await ctx.emit("token", {"text": "a"})
    second = await ctx.emit("token", {"text": "b"})
    await ctx.progress(50, "half")
    tokens = [e.data for e in await backend.events(job.task_id) if e.type == "token"]
    assert tokens == [{"text": "a"}, {"text": "b"}]  # none lost, none twice
    assert second == first + 1
    assert [e.type for e in await backend.events(job.task_id)].count("progress") == 1


async def test_an_outage_longer_than_the_lease_fails_the_write() -> None:
    backend = MemoryBackend()
    job = await _running(backend)
    ctx = JobContext(job, _Flaky(backend, 1000, landed=False), SystemClock(), ride_out_s=0.3)  # type: ignore[arg-type]
    with pytest.raises(BackendConnectionError):
        await ctx.emit("token", {"text": "a"})
