"""Small test helpers: wait on conditions (never on bare sleeps), run worker tasks."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from backburner import Backburner, Job, JobContext, Settings
from backburner.backends import Backend
from backburner.clock import ManualClock
from backburner.worker import Worker

WORKER_TEST_SETTINGS = Settings(
    backend_url="memory://",
    cancel_poll_s=0.05,
    sweep_interval_s=0.05,
    heartbeat_s=0.1,
    lease_s=5.0,
    retry_base_s=0.01,
    retry_cap_s=0.05,
    idle_wait_s=0.5,
)
"""Fast periodic duties and short backoff, for tests of the worker runtime."""


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    timeout: float = 20.0,
    interval: float = 0.01,
    message: str = "condition",
) -> float:
    """Poll ``check`` until it is true; returns the seconds it took. Fails after ``timeout``."""
    start = time.monotonic()
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{message} not reached within {timeout}s")
        await asyncio.sleep(interval)


@asynccontextmanager
async def running_worker(bb: Backburner, **options: object) -> AsyncIterator[Worker]:
    """A worker running in this event loop; shut down (gracefully) on exit."""
    worker = bb.worker(**options)  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    await asyncio.wait(
        {task, asyncio.create_task(worker.started.wait())}, return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():
        task.result()
    try:
        yield worker
    finally:
        worker.shutdown()
        await asyncio.wait_for(task, 30)


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port nobody listens on (bound, then closed, then used at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WorkerProcesses:
    """The ``backburner worker`` (or ``command``) subprocesses of one test, each logging to a
    file in ``log_dir``; ``stop()`` ends every one still running."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, *args: str, env: dict[str, str], command: str = "worker"
    ) -> subprocess.Popen[bytes]:
        log_path = self.log_dir / f"{command}-{len(self.procs)}.log"
        with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "backburner", command, *args],
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def stop(self, *, graceful: bool = False) -> None:
        """SIGKILL (or, with ``graceful``, SIGTERM first and SIGKILL after 15 s) and reap."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate() if graceful else proc.kill()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def abandoned_job(
    backend: Backend, settings: Settings, *, max_attempts: int, lease_s: float
) -> tuple[Backburner, ManualClock, Job]:
    """An app on a manual clock (at 1000.0) with one task, ``noop``, and a job of it claimed
    by a worker that is gone (its lease ends ``lease_s`` from now)."""
    clock = ManualClock(1000.0)
    bb = Backburner(backend, settings=settings, clock=clock)

    @bb.task(max_attempts=max_attempts)
    async def noop(ctx: JobContext) -> None:
        return None

    job = await bb.enqueue("noop")
    [claimed] = await backend.claim("gone", limit=1, now=clock.now(), lease_s=lease_s)
    assert claimed.task_id == job.task_id
    return bb, clock, claimed
