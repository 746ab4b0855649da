"""The API's event hub: one backend wait for every stream, no busy loop behind a slow one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from backburner.api.events import EventHub
from backburner.backends.memory import MemoryBackend
from backburner.clock import ManualClock

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
