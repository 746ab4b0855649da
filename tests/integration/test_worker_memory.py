"""What a running job costs its worker in memory: bounded, so a worker can hold 10,000.

Measured with tracemalloc (Python's own allocations, not RSS: the same figure on any machine)
from the worker's start to the moment every job's handler is running, divided by the jobs.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator

import pytest

from backburner import Backburner
from backburner.backends import Backend
from backburner.context import JobContext

from ..helpers import WORKER_TEST_SETTINGS, running_worker

JOBS = 400

BYTES_PER_RUNNING_JOB = 6_000
"""Measured 4.8 KB on SQLite, 4.6 KB on Redis (2026-12-05): the Job (1.7 KB), its asyncio task,
the coroutines of the attempt and of the handler, the attempt's context. It was 8.2 and 8.0 KB
before stored jobs shared one set of field names and the default progress, and attempts one
pair of callbacks."""


async def enqueue(bb: Backburner, count: int) -> None:
    for _ in range(count):
        await bb.enqueue("hold")


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("backend_kind", ["sqlite", "redis"])
async def test_a_running_job_costs_its_worker_under_6_kb(backend: Backend, traced: None) -> None:
    bb = Backburner(backend, settings=WORKER_TEST_SETTINGS)
    started = 0
    all_started = asyncio.Event()
    release = asyncio.Event()

    @bb.task(max_attempts=1)
    async def hold(ctx: JobContext) -> None:
        nonlocal started
        started += 1
        if started == JOBS:
            all_started.set()
        await release.wait()

    await enqueue(bb, JOBS)
    gc.collect()  # (what enqueue left is garbage before the worker starts, not after)
    before, _ = tracemalloc.get_traced_memory()
    async with running_worker(bb, concurrency=JOBS):
        await asyncio.wait_for(all_started.wait(), 60)
        during, _ = tracemalloc.get_traced_memory()
        release.set()
    per_job = (during - before) / JOBS
    assert 0 < per_job < BYTES_PER_RUNNING_JOB, f"{per_job:,.0f} bytes per running job"
