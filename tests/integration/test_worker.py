"""The worker runtime in-process, on every backend: retries, timeouts, cancel, shutdown, hooks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from backburner import Backburner, Hooks, Job, PermanentError, Retry, current_job
from backburner.backends import Backend
from backburner.clock import ManualClock
from backburner.context import JobContext
from backburner.errors import LeaseLostError
from backburner.models import ErrorInfo, JobStatus
from backburner.worker import Worker
from backburner.worker.timeouts import CoarseTimeouts

from ..helpers import WORKER_TEST_SETTINGS, eventually, running_worker

FAST = WORKER_TEST_SETTINGS


def make_app(backend: Backend, **changes: Any) -> Backburner:
    return Backburner(backend, settings=FAST.replace(**changes))


async def test_runs_a_job_with_progress_events_and_usage(backend: Backend) -> None:
    bb = make_app(backend)
    seen: list[str] = []

    @bb.task
    async def summarize(ctx: JobContext, text: str) -> dict[str, Any]:
        assert current_job() is ctx
        seen.append(ctx.job_id)
        await ctx.progress(10, "reading")
        await ctx.emit("token", {"text": "Hello"})
        ctx.add_usage(input_tokens=3, output_tokens=1)
        return {"summary": text.upper()}

    async with running_worker(bb):
        job = await bb.enqueue("summarize", {"text": "abc"})
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED
    assert done.result == {"summary": "ABC"}
    assert done.usage is not None and done.usage.output_tokens == 1
    assert done.progress.percent == 100 and done.progress.message == "reading"
    assert seen == [job.task_id]
    events = await bb.events(job.task_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events] == ["status", "status", "progress", "token", "status"]
    assert events[-1].data["status"] == "completed"


async def test_retry_after_is_honoured(backend: Backend) -> None:
    bb = make_app(backend)

    @bb.task(max_attempts=3)
    async def limited(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise Retry("429 Too Many Requests", after=0.4)
        return ctx.attempt

    async with running_worker(bb):
        job = await bb.enqueue("limited")
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.result == 2
    first, second = done.history
    assert first.outcome == "retry" and first.error is not None
    assert first.error.type == "retry"
    assert first.finished_at is not None
    assert second.started_at - first.finished_at >= 0.4


async def test_exhausted_retries_land_in_dlq_and_replay_runs_again(backend: Backend) -> None:
    bb = make_app(backend)
    healthy = False

    @bb.task(max_attempts=3)
    async def flaky(ctx: JobContext) -> str:
        if not healthy:
            raise ConnectionError("upstream refused")
        return "ok"

    async with running_worker(bb):
        job = await bb.enqueue("flaky")
        failed = await bb.wait(job.task_id, timeout=20)
        assert failed.status == JobStatus.FAILED
        assert failed.attempts == 3
        assert failed.error is not None and failed.error.type == "ConnectionError"
        assert "gave up after 3 attempts" in failed.error.message
        assert [h.outcome for h in failed.history] == ["retry", "retry", "failed"]
        dead = await bb.dead_letters()
        assert [j.task_id for j in dead.jobs] == [job.task_id]
        # Expires from the DLQ no sooner than the dead-letter TTL.
        assert failed.expires_at is not None and failed.finished_at is not None
        assert failed.expires_at - failed.finished_at >= FAST.dead_letter_ttl_s

        healthy = True
        replayed = await bb.replay(job.task_id)
        assert replayed.status == JobStatus.QUEUED and replayed.max_attempts == 6
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.attempts == 4
    assert [h.outcome for h in done.history] == ["retry", "retry", "failed", "completed"]
    assert (await bb.dead_letters()).jobs == []


async def test_permanent_errors_fail_at_once(backend: Backend) -> None:
    bb = make_app(backend)

    class ContextTooLong(Exception):
        pass

    @bb.task(max_attempts=5)
    async def hopeless(ctx: JobContext) -> None:
        raise PermanentError("400: bad request")

    @bb.task(max_attempts=5, permanent_on=(ContextTooLong,))
    async def too_long(ctx: JobContext) -> None:
        raise ContextTooLong("context length exceeded")

    async with running_worker(bb):
        a = await bb.enqueue("hopeless")
        b = await bb.enqueue("too_long")
        first = await bb.wait(a.task_id, timeout=20)
        second = await bb.wait(b.task_id, timeout=20)
    assert (first.status, first.attempts) == (JobStatus.FAILED, 1)
    assert first.error == ErrorInfo(type="PermanentError", message="400: bad request")
    assert (second.status, second.attempts) == (JobStatus.FAILED, 1)
    assert second.error is not None and second.error.type == "ContextTooLong"
    assert second.error.retryable is False


@pytest.mark.parametrize("coarse", [False, True], ids=["asyncio-timeout", "coarse"])
async def test_attempt_timeout_uses_cancellation_and_retries(
    backend: Backend, coarse: bool
) -> None:
    """A timeout cancels the handler, the same way whether it is asyncio.timeout (under
    ``min_timeout_s``) or CoarseTimeouts (one timer per grain, for long ones): the attempt fails
    as a retryable ``timeout``; so does a handler that swallows the cancellation and returns
    (its result came past the limit: a review saw one completed 1.5 s past its timeout, and
    past its job's deadline), one that raises something else fails with that; the task's
    cancel count is taken back either way; nothing stays armed."""
    cancelling: list[int] = []

    class Watcher(Hooks):  # (the hooks run in the attempt's own task)
        async def on_complete(self, job: Job) -> None:
            task = asyncio.current_task()
            cancelling.append(-1 if task is None else task.cancelling())

        async def on_fail(self, job: Job) -> None:
            await self.on_complete(job)

    bb = Backburner(backend, settings=FAST, hooks=[Watcher()])
    cancelled = 0

    @bb.task(max_attempts=2, timeout=0.3)
    async def stuck(ctx: JobContext) -> None:
        nonlocal cancelled
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled += 1
            raise

    @bb.task(timeout=0.3, max_attempts=2)
    async def stubborn(ctx: JobContext) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "kept"
        return "slept"

    @bb.task(timeout=0.3, max_attempts=1)
    async def switches(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise LookupError("gave up") from None

    async with running_worker(bb) as worker:
        if coarse:
            worker.timeouts = CoarseTimeouts(grain_s=0.1, min_timeout_s=0.2)
        assert (worker.timeouts.min_timeout_s <= 0.3) is coarse  # (which path runs)
        timeouts = worker.timeouts
        job = await bb.enqueue("stuck")
        kept = await bb.enqueue("stubborn")
        other = await bb.enqueue("switches")
        done = await bb.wait(job.task_id, timeout=20)
        swallowed = await bb.wait(kept.task_id, timeout=20)
        raised = await bb.wait(other.task_id, timeout=20)
        assert timeouts.armed() == 0
    assert done.status == JobStatus.FAILED and done.attempts == 2 and cancelled == 2
    assert done.error is not None and (done.error.type, done.error.retryable) == ("timeout", True)
    assert done.error.message.startswith("the attempt timed out")
    for record in done.history:
        assert record.finished_at is not None
        assert 0.25 <= record.finished_at - record.started_at < 5
    assert (swallowed.status, swallowed.attempts, swallowed.result) == (JobStatus.FAILED, 2, None)
    assert swallowed.error is not None and swallowed.error.type == "timeout"
    # Another exception raised on the cancellation is the attempt's error, as it would be out
    # of asyncio.timeout.
    assert raised.status == JobStatus.FAILED and raised.error is not None
    assert raised.error.type == "LookupError"
    # Whatever came out, the cancellation was taken back, as asyncio.timeout does.
    assert cancelling == [0, 0, 0], cancelling  # (one hook run per job: its end)


async def test_a_cancel_overrides_a_long_timeout_that_is_under_way(backend: Backend) -> None:
    bb = make_app(backend)
    started = asyncio.Event()
    release = asyncio.Event()

    @bb.task(timeout=0.3)
    async def clings(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await release.wait()  # the timeout has cancelled it; it is still winding down
            raise

    async with running_worker(bb) as worker:
        worker.timeouts = CoarseTimeouts(grain_s=0.1, min_timeout_s=0.2)
        job = await bb.enqueue("clings")
        await asyncio.wait_for(started.wait(), 20)
        attempt = next(iter(worker.running.values()))
        await eventually(lambda: attempt.stop_reason == "timed_out")
        assert worker.cancel_local(job.task_id, attempt.job.fence)
        release.set()
        assert attempt.task is not None
        await asyncio.wait({attempt.task}, timeout=20)
        assert attempt.task.cancelled()
    # Stopped as cancelled: nothing written (a timeout would have stored a retry).
    assert attempt.stop_reason == "cancelled" and attempt.settled
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.status == JobStatus.PROCESSING and stored.error is None


async def test_total_deadline_stops_retrying(backend: Backend) -> None:
    bb = make_app(backend, retry_base_s=0.2, retry_cap_s=0.2)

    @bb.task(max_attempts=100)
    async def slow(ctx: JobContext) -> None:
        await asyncio.sleep(0.2)
        raise ConnectionError("again")

    async with running_worker(bb):
        job = await bb.enqueue("slow", deadline=0.5)
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.FAILED
    assert done.error is not None and done.error.type in ("deadline_exceeded", "timeout")
    assert done.attempts < 10
    assert done.finished_at is not None and done.finished_at - done.created_at < 5


async def test_cancel_a_running_job_stops_it_within_a_second(backend: Backend) -> None:
    bb = make_app(backend)
    started = asyncio.Event()
    stopped_at: list[float] = []

    @bb.task
    async def long_generation(ctx: JobContext) -> None:
        await ctx.emit("token", {"text": "partial"})
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped_at.append(time.monotonic())

    async with running_worker(bb):
        job = await bb.enqueue("long_generation")
        await asyncio.wait_for(started.wait(), 20)
        asked = time.monotonic()
        cancelled = await bb.cancel(job.task_id)
        assert cancelled.status == JobStatus.CANCELLED
        await eventually(lambda: bool(stopped_at), timeout=5, message="handler stopped")
    assert stopped_at[0] - asked < 1.0
    final = await bb.get(job.task_id)
    assert final.status == JobStatus.CANCELLED
    types = [e.type for e in await bb.events(job.task_id)]
    assert types == ["status", "status", "token", "status"]
    assert (await bb.cancel(job.task_id)).status == JobStatus.CANCELLED  # idempotent


async def test_cancel_through_another_app_reaches_the_worker(backend: Backend) -> None:
    """The canceller is not the worker's app: the signal goes through the backend."""
    worker_app = make_app(backend)
    other_app = make_app(backend)
    started = asyncio.Event()
    stopped = asyncio.Event()

    @worker_app.task
    async def spin(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()

    @other_app.task(name="spin")
    async def spin_stub(ctx: JobContext) -> None:
        raise AssertionError("never runs here")

    async with running_worker(worker_app):
        job = await other_app.enqueue("spin")
        await asyncio.wait_for(started.wait(), 20)
        asked = time.monotonic()
        await other_app.cancel(job.task_id)
        await asyncio.wait_for(stopped.wait(), 5)
        assert time.monotonic() - asked < 1.0


async def test_queued_job_cancelled_never_runs(backend: Backend) -> None:
    bb = make_app(backend)
    ran: list[str] = []

    @bb.task
    async def noop(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    job = await bb.enqueue("noop", delay=0.3)
    cancelled = await bb.cancel(job.task_id)
    assert cancelled.status == JobStatus.CANCELLED
    async with running_worker(bb):
        marker = await bb.enqueue("noop", delay=0.4)
        await bb.wait(marker.task_id, timeout=20)
    assert ran == [marker.task_id]


async def test_concurrency_limit_and_priority_order(backend: Backend) -> None:
    bb = make_app(backend)
    order: list[int] = []
    active = 0
    peak = 0

    @bb.task
    async def work(ctx: JobContext, n: int) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        order.append(n)
        await asyncio.sleep(0.02)
        active -= 1

    jobs = [await bb.enqueue("work", {"n": n}, priority=0) for n in range(6)]
    jobs += [await bb.enqueue("work", {"n": 100 + n}, priority=10) for n in range(3)]
    async with running_worker(bb, concurrency=1):
        for job in jobs:
            await bb.wait(job.task_id, timeout=20)
    assert order == [100, 101, 102, 0, 1, 2, 3, 4, 5]
    assert peak == 1

    active = peak = 0
    more = [await bb.enqueue("work", {"n": n}) for n in range(12)]
    async with running_worker(bb, concurrency=3):
        for job in more:
            await bb.wait(job.task_id, timeout=20)
    assert peak == 3


async def test_delayed_job_waits_until_due(backend: Backend) -> None:
    bb = make_app(backend)

    @bb.task
    async def later(ctx: JobContext) -> None:
        return None

    async with running_worker(bb):
        job = await bb.enqueue("later", delay=0.5)
        done = await bb.wait(job.task_id, timeout=20)
    assert done.started_at is not None
    assert done.started_at - done.created_at >= 0.5


async def test_graceful_shutdown_lets_running_jobs_finish(backend: Backend) -> None:
    bb = make_app(backend, shutdown_grace_s=20)
    started = asyncio.Event()

    @bb.task
    async def short(ctx: JobContext) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "finished"

    worker = bb.worker()
    task = asyncio.create_task(worker.run())
    job = await bb.enqueue("short")
    await asyncio.wait_for(started.wait(), 20)
    worker.shutdown()
    await asyncio.wait_for(task, 20)
    done = await bb.get(job.task_id)
    assert done.status == JobStatus.COMPLETED and done.result == "finished"


async def start_endless_job(
    backend: Backend, **settings: Any
) -> tuple[Backburner, Worker, asyncio.Task[None], Job, asyncio.Event]:
    """A worker running a job that would never end (max_attempts=1) until stopped."""
    bb = make_app(backend, **settings)
    started = asyncio.Event()

    @bb.task(max_attempts=1)
    async def endless(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    worker = bb.worker()
    task = asyncio.create_task(worker.run())
    job = await bb.enqueue("endless")
    await asyncio.wait_for(started.wait(), 20)
    return bb, worker, task, job, started


async def test_shutdown_after_grace_hands_jobs_back_without_burning_an_attempt(
    backend: Backend,
) -> None:
    bb, worker, task, job, started = await start_endless_job(backend, shutdown_grace_s=0.2)
    worker.shutdown()
    await asyncio.wait_for(task, 20)
    back = await bb.get(job.task_id)
    assert back.status == JobStatus.QUEUED
    assert back.attempts == 0 and back.max_attempts == 1
    assert back.history[-1].outcome == "released"
    # The single allowed attempt is still there: a new worker runs it.
    started.clear()
    async with running_worker(bb):
        await asyncio.wait_for(started.wait(), 20)
        running = await bb.get(job.task_id)
        assert running.status == JobStatus.PROCESSING and running.attempts == 1
        assert running.fence == 2
        await bb.cancel(job.task_id)


async def test_second_shutdown_hands_back_at_once(backend: Backend) -> None:
    _, worker, task, job, _ = await start_endless_job(backend, shutdown_grace_s=60)
    bb = worker.app
    worker.shutdown()
    worker.shutdown()
    await asyncio.wait_for(task, 5)
    back = await bb.get(job.task_id)
    assert back.status == JobStatus.QUEUED and back.attempts == 0


async def test_lost_lease_stops_the_job_and_fences_its_writes(backend: Backend) -> None:
    clock = ManualClock(start=time.time())
    bb = Backburner(backend, settings=FAST.replace(lease_s=30), clock=clock)
    first_started = asyncio.Event()
    first_stopped = asyncio.Event()

    @bb.task(max_attempts=3)
    async def job_fn(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            first_started.set()
            try:
                await asyncio.sleep(60)
            finally:
                first_stopped.set()
        return ctx.attempt

    async with running_worker(bb) as worker:
        job = await bb.enqueue("job_fn")
        await asyncio.wait_for(first_started.wait(), 20)

        async def taken_over() -> bool:
            # Each pass makes every lease look expired; a heartbeat may renew it first, so
            # repeat until the sweeper has taken the job from attempt 1. Look before moving
            # the clock: moving it once more would expire attempt 2's lease as well.
            current = await bb.get(job.task_id)
            if current.fence > 1 or current.status != JobStatus.PROCESSING:
                return True
            clock.advance(31)
            await bb.sweep()
            return False

        await eventually(taken_over, timeout=20, message="lease taken over")
        # The old attempt may not write anything any more.
        with pytest.raises(LeaseLostError):
            await backend.append_event(job.task_id, 1, "token", {"x": 1}, now=clock.now())
        await asyncio.wait_for(first_stopped.wait(), 10)
        done = await bb.wait(job.task_id, timeout=20)
        assert worker.running == {}
    assert done.status == JobStatus.COMPLETED and done.result == 2
    assert [h.outcome for h in done.history] == ["retry", "completed"]
    assert done.history[0].error is not None
    assert done.history[0].error.type == "lease_expired"
    terminal = [e for e in await bb.events(job.task_id) if e.type == "status"]
    assert [e.data["status"] for e in terminal].count("completed") == 1


async def test_hooks_see_every_transition(backend: Backend) -> None:
    calls: list[tuple[str, str]] = []

    class Recorder(Hooks):
        async def on_enqueue(self, job: Job) -> None:
            calls.append(("enqueue", job.type))

        async def on_start(self, job: Job) -> None:
            calls.append(("start", job.type))

        async def on_retry(self, job: Job, error: ErrorInfo) -> None:
            calls.append(("retry", job.type))

        async def on_complete(self, job: Job) -> None:
            calls.append(("complete", job.type))

        async def on_fail(self, job: Job) -> None:
            calls.append(("fail", job.type))

        async def on_cancel(self, job: Job) -> None:
            calls.append(("cancel", job.type))

    class Broken(Hooks):
        async def on_complete(self, job: Job) -> None:
            raise RuntimeError("a broken hook must not break the worker")

    bb = Backburner(backend, settings=FAST, hooks=[Broken(), Recorder()])

    @bb.task(max_attempts=2)
    async def twice(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise Retry(after=0)

    @bb.task(max_attempts=1)
    async def bad(ctx: JobContext) -> None:
        raise PermanentError("no")

    @bb.task
    async def idle(ctx: JobContext) -> None:
        return None

    async with running_worker(bb):
        a = await bb.enqueue("twice")
        b = await bb.enqueue("bad")
        await bb.wait(a.task_id, timeout=20)
        await bb.wait(b.task_id, timeout=20)
    c = await bb.enqueue("idle", delay=60)
    await bb.cancel(c.task_id)
    assert sorted(c for c in calls if c[1] == "twice") == sorted(
        [
            ("enqueue", "twice"),
            ("start", "twice"),
            ("retry", "twice"),
            ("start", "twice"),
            ("complete", "twice"),
        ]
    )
    assert sorted(c for c in calls if c[1] == "bad") == sorted(
        [("enqueue", "bad"), ("start", "bad"), ("fail", "bad")]
    )
    assert [c for c in calls if c[1] == "idle"] == [("enqueue", "idle"), ("cancel", "idle")]


async def test_workers_claim_only_the_tasks_they_know(backend: Backend) -> None:
    gpu = make_app(backend)
    cpu = make_app(backend)

    @gpu.task
    async def render(ctx: JobContext) -> str:
        return "rendered"

    @cpu.task
    async def parse(ctx: JobContext) -> str:
        return "parsed"

    for app in (gpu, cpu):  # each producer may enqueue both
        app.tasks.update({**gpu.tasks, **cpu.tasks})
    render_job = await cpu.enqueue("render", priority=10)
    parse_job = await cpu.enqueue("parse")
    cpu.tasks.pop("render")
    async with running_worker(cpu):
        assert (await cpu.wait(parse_job.task_id, timeout=20)).result == "parsed"
        assert (await cpu.get(render_job.task_id)).status == JobStatus.QUEUED
    gpu.tasks.pop("parse")
    async with running_worker(gpu):
        assert (await gpu.wait(render_job.task_id, timeout=20)).result == "rendered"


async def test_a_result_that_is_not_json_fails_permanently(backend: Backend) -> None:
    bb = make_app(backend)

    @bb.task(max_attempts=3)
    async def weird(ctx: JobContext) -> object:
        return {1, 2}

    async with running_worker(bb):
        job = await bb.enqueue("weird")
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.FAILED and done.attempts == 1
    assert done.error is not None and done.error.type == "invalid_result"


async def test_holds_thousands_of_sleeping_jobs_at_once(backend: Backend) -> None:
    bb = make_app(backend)
    active = 0
    peak = 0
    release = asyncio.Event()

    @bb.task
    async def nap(ctx: JobContext) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1

    count = 2000
    for _ in range(count):
        await bb.enqueue("nap")
    async with running_worker(bb, concurrency=count):
        await eventually(lambda: peak == count, timeout=60, message="all jobs running")
        release.set()
        await eventually(
            lambda: _all_done(bb), timeout=60, interval=0.05, message="all jobs completed"
        )
    stats = await bb.backend.stats(now=time.time())
    assert stats.counts[JobStatus.COMPLETED] == count


async def _all_done(bb: Backburner) -> bool:
    stats = await bb.backend.stats(now=time.time())
    return stats.counts[JobStatus.QUEUED] == 0 and stats.counts[JobStatus.PROCESSING] == 0
