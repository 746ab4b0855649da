"""A worker whose backend fails while it stores an outcome: the job's real outcome still wins.

A dropped connection says nothing about the job. The worker must retry the same outcome (not
turn a success into a failure), and a write whose reply was lost must count as written.
"""

from __future__ import annotations

from typing import Any

from backburner import Backburner, Hooks, Job
from backburner.backends.base import Outcome
from backburner.backends.memory import MemoryBackend
from backburner.context import JobContext
from backburner.errors import BackendError
from backburner.models import JobStatus

from ..helpers import WORKER_TEST_SETTINGS, running_worker


class FlakyFinish(MemoryBackend):
    """finish() fails ``failures`` times: before writing, or (``after_write``) after it."""

    def __init__(self, failures: int, *, after_write: bool) -> None:
        super().__init__()
        self.failures = failures
        self.after_write = after_write
        self.calls = 0

    async def finish(self, task_id: str, fence: int, outcome: Outcome, **kwargs: Any) -> Job:
        self.calls += 1
        if self.calls > self.failures:
            return await super().finish(task_id, fence, outcome, **kwargs)
        if self.after_write:
            await super().finish(task_id, fence, outcome, **kwargs)
        raise BackendError("Redis at 127.0.0.1:6379: the Redis connection was lost")


class Completions(Hooks):
    def __init__(self) -> None:
        self.completed: list[str] = []
        self.failed: list[str] = []

    async def on_complete(self, job: Job) -> None:
        self.completed.append(job.task_id)

    async def on_fail(self, job: Job) -> None:
        self.failed.append(job.task_id)


def make_app(backend: MemoryBackend) -> tuple[Backburner, Completions]:
    bb = Backburner(backend, settings=WORKER_TEST_SETTINGS)
    seen = Completions()
    bb.hooks.hooks.append(seen)

    @bb.task(max_attempts=1)
    async def answer(ctx: JobContext) -> int:
        return 42

    return bb, seen


async def test_a_success_is_stored_after_the_backend_fails_twice() -> None:
    backend = FlakyFinish(2, after_write=False)
    bb, seen = make_app(backend)
    async with running_worker(bb):
        job = await bb.enqueue("answer")
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.result == 42
    assert done.attempts == 1
    assert backend.calls == 3
    assert seen.completed == [job.task_id] and seen.failed == []


async def test_a_write_whose_reply_was_lost_counts_as_written() -> None:
    backend = FlakyFinish(1, after_write=True)
    bb, seen = make_app(backend)
    async with running_worker(bb):
        job = await bb.enqueue("answer")
        done = await bb.wait(job.task_id, timeout=20)
        assert done.status == JobStatus.COMPLETED and done.result == 42
        # The retry was refused (the job was no longer running) yet its hooks ran, once.
        await bb.wait(job.task_id, timeout=20)
    assert backend.calls == 2
    assert seen.completed == [job.task_id] and seen.failed == []
