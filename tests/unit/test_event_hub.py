"""The API's event hub: one backend wait for every stream, no busy loop behind a slow one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from backburner.api.events import EventHub, event_stream
from backburner.backends.memory import MemoryBackend
from backburner.clock import ManualClock
from backburner.errors import BackendConnectionError
from backburner.models import Event

from ..conformance._support import new_job


class CountingBackend(MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    async def wait_for_events(self, after: Mapping[str, int], *, timeout: float) -> dict[str, int]:
        self.waits += 1
        return await super().wait_for_events(after, timeout=timeout)


async def test_a_lagging_stream_does_not_make_the_hub_spin() -> None:
    backend = CountingBackend()
    job, _ = await backend.enqueue(new_job())  # its log holds seq 1
    hub = EventHub(backend, idle_timeout_s=5)
    lagging = hub.subscribe(job.task_id, after=0)  # never reads: a client that stalled
    current = hub.subscribe(job.task_id, after=1)
    await asyncio.wait_for(lagging.wake.wait(), 5)  # told once that there is more
    waits_then = backend.waits
    await asyncio.sleep(0.3)  # a spinning hub would call the backend thousands of times here
    assert backend.waits - waits_then <= 2
    assert not current.wake.is_set()  # the caught-up stream was left alone
    clock = ManualClock()
    claimed = await backend.claim("w", limit=1, now=clock.now(), lease_s=60)  # appends seq 2
    assert [j.task_id for j in claimed] == [job.task_id]
    await asyncio.wait_for(current.wake.wait(), 5)
    hub.unsubscribe(lagging)
    hub.unsubscribe(current)
    assert hub.subscriptions == 0
    await hub.close()


async def _read(stream: Any, into: list[str]) -> None:
    async for chunk in stream:
        into.append(chunk)


async def test_drain_ends_every_open_stream_and_each_new_one_at_once() -> None:
    backend = MemoryBackend()
    job, _ = await backend.enqueue(new_job())  # queued: its stream would wait for its end
    hub = EventHub(backend, idle_timeout_s=5)
    sent: list[str] = []
    reading = asyncio.create_task(_read(event_stream(hub, job.task_id, 0, keepalive_s=60), sent))
    while len(sent) < 2:  # the retry line, then the queued event
        await asyncio.sleep(0.01)
    assert not reading.done()
    hub.drain()
    await asyncio.wait_for(reading, 5)  # not the keep-alive's 60 s
    assert sent[1].startswith("id: 1\n") and hub.subscriptions == 0
    late: list[str] = []
    await asyncio.wait_for(_read(event_stream(hub, job.task_id, 1, keepalive_s=60), late), 5)
    assert late == ["retry: 1000\n\n"]  # the client comes back after 1 s, elsewhere
    await hub.close()


class FailingBackend(MemoryBackend):
    """Answers reads until ``fail`` is set, then fails as a lost server does."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        if self.fail:
            raise BackendConnectionError("the connection to the backend was lost")
        return await super().events(task_id, after=after, limit=limit)


async def test_a_backend_failure_mid_stream_ends_the_stream_not_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = FailingBackend()
    job, _ = await backend.enqueue(new_job())
    hub = EventHub(backend, idle_timeout_s=5)
    sent: list[str] = []
    reading = asyncio.create_task(_read(event_stream(hub, job.task_id, 0, keepalive_s=60), sent))
    while len(sent) < 2:
        await asyncio.sleep(0.01)
    backend.fail = True
    await backend.claim("w", limit=1, now=ManualClock().now(), lease_s=60)  # an event: wakes it
    await asyncio.wait_for(reading, 5)  # ended, with no exception for the server to log
    assert len(sent) == 2
    assert "backend failed" in caplog.text and job.task_id in caplog.text
    await hub.close()


async def test_create_app_takes_signals_to_worker_its_earlier_name(tmp_path: Any) -> None:
    import signal

    from backburner import Settings
    from backburner.api import create_app

    before = signal.getsignal(signal.SIGTERM)
    settings = Settings(backend_url=f"sqlite:///{tmp_path}/a.db")
    for option in ("handle_signals", "signals_to_worker"):
        app = create_app(settings, **{option: True})
        async with app.router.lifespan_context(app):
            assert signal.getsignal(signal.SIGTERM) is not before, option  # ours, while it runs
        assert signal.getsignal(signal.SIGTERM) is before
