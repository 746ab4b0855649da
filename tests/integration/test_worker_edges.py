"""The worker's rough edges: odd handlers, failing stores, slow hooks, abrupt shutdowns."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, Hooks, Job
from backburner.api.events import format_event
from backburner.backends import Backend
from backburner.backends.base import Complete, Outcome
from backburner.context import JobContext
from backburner.errors import BackendError, InvalidInputError
from backburner.models import Event, JobStatus
from backburner.worker import runner

from ..helpers import WORKER_TEST_SETTINGS, abandoned_job, eventually, running_worker

FAST = WORKER_TEST_SETTINGS.replace(lease_s=1.0)


async def test_a_handler_raising_cancelled_error_is_an_ordinary_failure(backend: Backend) -> None:
    bb = Backburner(backend, settings=FAST)

    @bb.task(max_attempts=2)
    async def odd(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise asyncio.CancelledError("raised by the handler, not by anyone cancelling")
        return "second time"

    async with running_worker(bb):
        job = await bb.enqueue("odd")
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.result == "second time"
    assert done.history[0].error is not None
    assert done.history[0].error.type == "CancelledError"


async def test_a_lone_surrogate_from_a_handler_is_never_stored(backend: Backend) -> None:
    # Python's json writes one, but no reader of a stored job could read it back: the job
    # would be lost to every read, listing and worker.
    bb = Backburner(backend, settings=FAST)

    @bb.task(max_attempts=1)
    async def returns_one(ctx: JobContext) -> dict[str, str]:
        return {"text": "half an emoji: \ud83d"}

    @bb.task(max_attempts=1)
    async def raises_one(ctx: JobContext) -> None:
        raise ValueError("bad byte \udcff in the reply")

    @bb.task(max_attempts=1)
    async def emits_one(ctx: JobContext) -> str:
        with pytest.raises(InvalidInputError, match="Unicode"):
            await ctx.emit("tick\ud800", {})
        with pytest.raises(InvalidInputError, match="lone UTF-16 surrogate"):
            await ctx.emit("tick", {"text": "\ud800"})
        return "refused"

    async with running_worker(bb):
        returned = await bb.enqueue("returns_one")
        raised = await bb.enqueue("raises_one")
        emitted = await bb.enqueue("emits_one")
        returned_done = await bb.wait(returned.task_id, timeout=20)
        raised_done = await bb.wait(raised.task_id, timeout=20)
        emitted_done = await bb.wait(emitted.task_id, timeout=20)
    assert (emitted_done.status, emitted_done.result) == (JobStatus.COMPLETED, "refused")
    assert returned_done.status == JobStatus.FAILED and returned_done.result is None
    assert returned_done.error is not None and returned_done.error.type == "invalid_result"
    assert "lone UTF-16 surrogate" in returned_done.error.message
    assert raised_done.status == JobStatus.FAILED
    assert raised_done.error is not None and raised_done.error.type == "ValueError"
    assert raised_done.error.message.startswith("bad byte \ufffd in the reply")
    listed = await bb.list(status="failed")
    assert {job.task_id for job in listed.jobs} == {returned.task_id, raised.task_id}


async def test_a_result_nested_past_what_readers_take_fails_the_job(backend: Backend) -> None:
    # Stored, it could never be read back (pydantic-core reads about 200 levels): on Redis
    # every read and listing of the job failed.
    bb = Backburner(backend, settings=FAST)

    @bb.task(max_attempts=1)
    async def deep(ctx: JobContext) -> object:
        result: object = "bottom"
        for level in range(250):
            result = (result,) if level % 2 else [result]  # (a tuple is written as an array)
        return result

    async with running_worker(bb):
        job = await bb.enqueue("deep")
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.FAILED and done.result is None
    assert done.error is not None and done.error.type == "invalid_result"
    assert "nests deeper than 192 levels" in done.error.message
    assert [j.task_id for j in (await bb.list(status="failed")).jobs] == [job.task_id]


async def test_usage_that_cannot_be_stored_fails_the_job_clearly(backend: Backend) -> None:
    bb = Backburner(backend, settings=FAST)

    @bb.task(max_attempts=3)
    async def leaky(ctx: JobContext) -> str:
        ctx.add_usage(input_tokens=1, model=object())
        return "ok"

    async with running_worker(bb):
        job = await bb.enqueue("leaky")
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.FAILED and done.attempts == 1
    assert done.error is not None and done.error.type == "invalid_result"
    assert "usage" in done.error.message


class FlakyStore:
    """Wraps a backend; its first ``failures`` finish() calls blow up unexpectedly."""

    def __init__(self, inner: Backend, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def finish(self, task_id: str, fence: int, outcome: Outcome, **kw: Any) -> Job:
        if self.failures > 0 and not kw.get("only_if_lease_expired"):
            self.failures -= 1
            raise RuntimeError("disk on fire")
        return await self.inner.finish(task_id, fence, outcome, **kw)


async def test_an_outcome_that_cannot_be_stored_is_not_left_running(backend: Backend) -> None:
    store = FlakyStore(backend, failures=2)
    bb = Backburner(store, settings=FAST)  # type: ignore[arg-type]

    @bb.task(max_attempts=3)
    async def work(ctx: JobContext) -> int:
        return ctx.attempt

    async with running_worker(bb):
        job = await bb.enqueue("work")
        # Both writes of attempt 1 fail; its lease is no longer renewed, so the sweeper takes
        # the job back and attempt 2 completes it.
        done = await bb.wait(job.task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED and done.result == 2
    assert done.history[0].error is not None
    assert done.history[0].error.type == "lease_expired"


async def test_slow_hooks_are_not_cut_off_by_heartbeats(backend: Backend) -> None:
    seen: list[str] = []

    class Slow(Hooks):
        async def on_complete(self, job: Job) -> None:
            seen.append("slow:start")
            await asyncio.sleep(0.6)  # several heartbeat periods
            seen.append("slow:end")

    class After(Hooks):
        async def on_complete(self, job: Job) -> None:
            seen.append("after")

    bb = Backburner(backend, settings=FAST, hooks=[Slow(), After()])

    @bb.task
    async def quick(ctx: JobContext) -> None:
        return None

    async with running_worker(bb):
        job = await bb.enqueue("quick")
        await bb.wait(job.task_id, timeout=20)
        await eventually(lambda: "after" in seen, timeout=20, message="hooks done")
    assert seen == ["slow:start", "slow:end", "after"]


class StopOnClaim:
    """Wraps a backend; ``requests`` shutdown requests arrive the moment a claim returns (two:
    the second skips the grace period)."""

    def __init__(self, inner: Backend, requests: int = 2) -> None:
        self.inner = inner
        self.requests = requests
        self.worker: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, *args: Any, **kw: Any) -> list[Job]:
        jobs: list[Job] = await self.inner.claim(*args, **kw)
        if jobs:
            for _ in range(self.requests):
                self.worker.shutdown()
        return jobs


@pytest.mark.parametrize("requests", [1, 2], ids=["graceful", "forced"])
async def test_jobs_a_claim_returns_as_a_shutdown_begins_go_back_unstarted(
    backend: Backend, requests: int
) -> None:
    store = StopOnClaim(backend, requests)
    bb = Backburner(store, settings=FAST.replace(shutdown_grace_s=60))  # type: ignore[arg-type]
    started: list[str] = []

    @bb.task(max_attempts=1)
    async def long(ctx: JobContext) -> None:
        started.append(ctx.job_id)
        await asyncio.sleep(60)

    jobs = [await bb.enqueue("long") for _ in range(50)]
    worker = store.worker = bb.worker(concurrency=50)
    await asyncio.wait_for(worker.run(), 20)
    assert started == []  # cancelled before their first step: no handler ran
    for job in jobs:
        back = await bb.get(job.task_id)
        assert back.status == JobStatus.QUEUED, back
        assert back.attempts == 0 and back.max_attempts == 1
    assert worker.running == {}


class GatedCompletion:
    """Wraps a backend; the write of a Complete waits at ``gate`` (a write in flight)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.writing = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def finish(self, task_id: str, fence: int, outcome: Outcome, **kw: Any) -> Job:
        if isinstance(outcome, Complete):
            self.writing.set()
            await self.gate.wait()
        return await self.inner.finish(task_id, fence, outcome, **kw)


class _Heard(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is logged."""

    def __init__(self, text: str, event: asyncio.Event) -> None:
        super().__init__()
        self.text, self.event = text, event

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


@pytest.mark.parametrize("second_signal", [False, True], ids=["graceful", "then-forced"])
async def test_a_write_in_flight_when_the_grace_ends(backend: Backend, second_signal: bool) -> None:
    """After the grace, a write in flight may land; after a second signal it gets only
    WRITE_REPLY_S (a reply that has not come by then is not coming), then it is cut short."""
    store = GatedCompletion(backend)
    bb = Backburner(store, settings=FAST.replace(shutdown_grace_s=0.1))  # type: ignore[arg-type]

    @bb.task(max_attempts=1)
    async def quick(ctx: JobContext) -> str:
        return "done"

    worker = bb.worker()
    running = asyncio.create_task(worker.run())
    job = await bb.enqueue("quick")
    await asyncio.wait_for(store.writing.wait(), 20)  # its outcome is being written
    grace_over = asyncio.Event()
    heard = _Heard("unfinished jobs back", grace_over)
    logger = logging.getLogger("backburner.worker")
    level = logger.level
    logger.addHandler(heard)
    logger.setLevel(logging.INFO)
    try:
        worker.shutdown()
        await asyncio.wait_for(grace_over.wait(), 20)  # the grace ended with the write in flight
        if second_signal:
            worker.shutdown()
            cut = time.monotonic()
            await asyncio.wait_for(running, runner.WRITE_REPLY_S + 10)
            assert time.monotonic() - cut >= runner.WRITE_REPLY_S - 1.0  # (its time to land)
        else:
            store.gate.set()
            await asyncio.wait_for(running, 20)
    finally:
        store.gate.set()
        logger.removeHandler(heard)
        logger.setLevel(level)
    done = await bb.get(job.task_id)
    if second_signal:
        assert done.status == JobStatus.QUEUED and done.attempts == 0, done  # handed back
    else:
        assert done.status == JobStatus.COMPLETED and done.result == "done"
        assert [h.outcome for h in done.history] == ["completed"]


class WatchedClaims:
    """Wraps a backend; counts the claims awaiting Redis at once, and asks the worker to shut
    down as the ``stop_at``-th claim returns (0: never)."""

    def __init__(self, inner: Backend, stop_at: int = 0, fail_at: int = 0) -> None:
        self.inner = inner
        self.stop_at = stop_at
        self.fail_at = fail_at
        """The claim that fails, sending nothing (0: none)."""
        self.worker: Any = None
        self.on_send: Any = None
        """Called with the number of claims sent so far as each is sent."""
        self.claimed: list[list[str]] = []
        self.sent = 0
        self.returned = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.limits: list[int] = []
        self.stopped = asyncio.Event()
        self.winding_down = asyncio.Event()
        """Set as the worker stops waiting for hand-offs: its wind-down has begun."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, *args: Any, **kw: Any) -> list[Job]:
        self.sent += 1
        number = self.sent
        if self.on_send is not None:
            self.on_send(self.sent)
        self.limits.append(kw["limit"])
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)  # (every claim takes a while: the next is sent meanwhile)
            if number == self.fail_at:
                raise BackendError("no claim today")
            jobs: list[Job] = await self.inner.claim(*args, **kw)
        finally:
            self.in_flight -= 1
        self.returned += 1
        self.claimed.append([job.task_id for job in jobs])
        if self.returned == self.stop_at:
            self.worker.shutdown()
            self.stopped.set()
        return jobs

    async def stop_waiting(self, worker_id: str) -> list[Job]:
        self.winding_down.set()
        jobs: list[Job] = await self.inner.stop_waiting(worker_id)
        return jobs


async def held_jobs(
    store: WatchedClaims,
    claim_batch: int,
    count: int,
    until: asyncio.Event,
    ran: list[str],
    **settings: Any,
) -> tuple[Backburner, list[Job]]:
    """An app on ``store`` (with FAST's settings, ``claim_batch`` and ``settings``) whose task
    "held" notes its job in ``ran`` and waits for ``until`` (no finish of its claims anything
    more), and ``count`` such jobs enqueued."""
    options = FAST.replace(claim_batch=claim_batch, **settings)
    bb = Backburner(store, settings=options)  # type: ignore[arg-type]

    @bb.task(max_attempts=1)
    async def held(ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        await until.wait()

    return bb, [await bb.enqueue("held") for _ in range(count)]


async def test_a_worker_with_a_full_queue_keeps_claims_ahead(backend: Backend) -> None:
    store, release = WatchedClaims(backend), asyncio.Event()
    bb, jobs = await held_jobs(store, 4, 40, release, [])
    async with running_worker(bb, concurrency=30) as worker:
        await eventually(lambda: len(worker.running) == 30, timeout=20, message="30 running")
        assert store.most_in_flight == 2  # the claim awaited, and one sent ahead of it
        assert sum(store.limits) == 30  # never more asked for than slots were free
        assert max(store.limits) == 4
        release.set()
        await eventually(lambda: not worker.running, timeout=20, message="all done")
        for job in jobs:
            done = await bb.wait(job.task_id, timeout=20)
            assert done.status == JobStatus.COMPLETED and done.attempts == 1


async def test_a_failed_claim_does_not_hold_back_the_jobs_of_the_next_one_sent_ahead(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "claim_backoff", lambda failures: 60.0)
    store, release = WatchedClaims(backend, fail_at=2), asyncio.Event()  # the first sent ahead
    ran: list[str] = []
    bb, jobs = await held_jobs(store, 5, 50, release, ran)
    async with running_worker(bb, concurrency=50):
        # The third claim was sent with the second: its jobs start at once, not after 60 s.
        await eventually(lambda: len(ran) >= 10, timeout=20, message="the third claim's jobs")
        assert set(store.claimed[1]) <= set(ran)
        release.set()
        for job in jobs:
            done = await bb.wait(job.task_id, timeout=20)
            assert done.status == JobStatus.COMPLETED and done.attempts == 1


async def test_jobs_of_claims_sent_ahead_go_back_when_the_worker_stops(backend: Backend) -> None:
    store = WatchedClaims(backend, stop_at=2)  # as the first claim sent ahead returns
    ran: list[str] = []
    bb, jobs = await held_jobs(store, 5, 50, store.stopped, ran)  # (held until it stops)
    worker = store.worker = bb.worker(concurrency=50)
    await asyncio.wait_for(worker.run(), 20)
    assert store.sent == 3 and store.most_in_flight == 2
    assert len(ran) == 5  # the first claim's; the two sent ahead came back as it stopped
    for job in jobs:
        back = await bb.get(job.task_id)
        if job.task_id in ran:
            assert back.status == JobStatus.COMPLETED, back
        else:
            assert back.status == JobStatus.QUEUED, back
            assert back.attempts == 0 and back.max_attempts == 1
    assert worker.running == {}


async def test_cancelling_the_worker_task_hands_every_job_it_holds_back(
    backend: Backend,
) -> None:
    store, release = WatchedClaims(backend), asyncio.Event()
    ran: list[str] = []
    bb, jobs = await held_jobs(store, 5, 50, release, ran)
    worker = bb.worker(concurrency=50)
    running = asyncio.create_task(worker.run())

    def cancel_on_the_third(sent: int) -> None:
        # The loop awaits the second claim (the first sent ahead), the third is ahead of it.
        if sent == 3:
            running.cancel()

    store.on_send = cancel_on_the_third
    await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 20)
    assert running.cancelled() and store.sent == 3
    # The first claim's jobs were running; the second's came back as the loop was cancelled
    # while it awaited it; the third was ahead. All are back in the queue, unstarted or
    # stopped, their attempt not charged, before run() ended: none waits for its lease.
    assert len(store.claimed) == 3 and [len(c) for c in store.claimed] == [5, 5, 5]
    claimed = {task_id for claim in store.claimed for task_id in claim}
    assert set(ran) == set(store.claimed[0])
    assert worker.running == {}
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("backburner:")]
    for job in jobs:
        back = await bb.get(job.task_id)
        assert back.status == JobStatus.QUEUED, back
        assert back.attempts == 0 and back.max_attempts == 1
        assert (job.task_id in claimed) == (back.history != [])  # (released: in its history)


class CancelOnFinish:
    """Wraps a backend; cancels ``target`` (the worker's task) as the ``at``-th outcome is
    sent to be written."""

    def __init__(self, inner: Backend, at: int) -> None:
        self.inner = inner
        self.at = at
        self.target: asyncio.Task[None] | None = None
        self.finishes = 0
        self.claims_carried = 0
        """Writes that also claimed the worker's next jobs."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def finish(self, *args: Any, **kw: Any) -> Job:
        self.finishes += 1
        if kw.get("then_claim") is not None:
            self.claims_carried += 1
        if self.finishes == self.at and self.target is not None:
            self.target.cancel()
        stored: Job = await self.inner.finish(*args, **kw)
        return stored


async def test_cancelling_a_busy_worker_loses_none_of_the_jobs_its_writes_claimed(
    backend: Backend,
) -> None:
    store = CancelOnFinish(backend, at=30)
    bb = Backburner(store, settings=FAST)  # type: ignore[arg-type]

    @bb.task(max_attempts=1)
    async def quick(ctx: JobContext) -> None:
        return None

    jobs = [await bb.enqueue("quick") for _ in range(200)]
    worker = bb.worker(concurrency=8)
    running = store.target = asyncio.create_task(worker.run())
    await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 20)
    assert running.cancelled()
    assert store.claims_carried >= store.at - 1  # (the writes in flight claimed jobs too)
    completed = 0
    for job in jobs:
        back = await bb.get(job.task_id)
        # None left processing, leased to a worker that is gone: each one is either done or
        # back in the queue with its attempt not charged.
        assert back.status in (JobStatus.COMPLETED, JobStatus.QUEUED), back
        assert back.attempts == (1 if back.status == JobStatus.COMPLETED else 0), back
        completed += back.status == JobStatus.COMPLETED
    assert store.at <= completed < len(jobs)


async def test_a_worker_cancelled_during_its_grace_hands_its_jobs_back_at_once(
    backend: Backend,
) -> None:
    store, never = WatchedClaims(backend), asyncio.Event()
    ran: list[str] = []
    bb, jobs = await held_jobs(store, 10, 10, never, ran, shutdown_grace_s=60)
    worker = bb.worker(concurrency=10)
    running = asyncio.create_task(worker.run())
    await eventually(lambda: len(ran) == 10, timeout=20, message="all ten running")
    worker.shutdown()  # graceful: it would wait up to 60 s for them
    await asyncio.wait_for(store.winding_down.wait(), 20)  # (it waits out the grace now)
    assert worker.running and not worker._force.is_set()
    running.cancel()
    await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 20)
    assert running.cancelled() and worker.running == {}
    for job in jobs:
        back = await bb.get(job.task_id)
        assert back.status == JobStatus.QUEUED and back.attempts == 0, back


async def test_an_event_type_that_could_break_an_sse_stream_is_refused(backend: Backend) -> None:
    bb = Backburner(backend, settings=FAST)

    @bb.task(max_attempts=1)
    async def emits(ctx: JobContext) -> list[str]:
        refused = []
        for kind in ("x\nid: 999\n\nevent: status", "tab\there", "x" * 201, "ok\u2028"):
            with pytest.raises(InvalidInputError, match="printable"):
                await ctx.emit(kind, {})
            refused.append(kind)
        await ctx.emit("tool.call é", {})
        await ctx.emit("y" * 200, {})
        return refused

    async with running_worker(bb):
        done = await bb.wait((await bb.enqueue("emits")).task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.result is not None
    assert len(done.result) == 4
    kinds = [event.type for event in await bb.events(done.task_id)]
    assert "tool.call é" in kinds and "y" * 200 in kinds
    assert not [kind for kind in kinds if not kind.isprintable()]


def test_an_sse_message_keeps_a_stored_line_break_inside_its_field() -> None:
    event = Event(task_id="task_x", seq=3, type="a\r\nid: 999\n\nevent: b", data=None, at=1.0)
    message = format_event(event)
    assert message.count("\n\n") == 1 and message.endswith("\n\n")
    assert message.splitlines()[:2] == ["id: 3", "event: a  id: 999  event: b"]


async def test_a_stop_and_a_dead_letter_are_each_logged_once(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    bb = Backburner(backend, settings=FAST)
    started = asyncio.Event()

    @bb.task(max_attempts=1)
    async def waits(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    @bb.task(max_attempts=1)
    async def unstorable(ctx: JobContext) -> set[int]:
        return {1}

    caplog.set_level(logging.INFO, logger="backburner")
    async with running_worker(bb):
        waiting = await bb.enqueue("waits")
        await asyncio.wait_for(started.wait(), 20)
        await bb.cancel(waiting.task_id)
        bad = await bb.enqueue("unstorable")
        done = await bb.wait(bad.task_id, timeout=20)
        await eventually(lambda: _said(caplog, f"job {waiting.task_id}: stopped"))
    assert done.error is not None and done.error.type == "invalid_result"
    assert len(_said(caplog, f"job {waiting.task_id}: stopped (cancelled)")) == 1
    assert len(_said(caplog, f"job {bad.task_id} attempt 1 failed: invalid_result")) == 1
    [dead] = _said(caplog, f"job {bad.task_id} failed for good (invalid_result)")
    assert (dead.levelno, getattr(dead, "event", None)) == (logging.WARNING, "dead_lettered")


def _said(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(start)]


async def test_a_sweeper_that_dead_letters_a_job_logs_it(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    bb, clock, job = await abandoned_job(backend, FAST, max_attempts=1, lease_s=1.0)
    clock.advance(5.0)
    report = await bb.sweep()
    assert report.failed == 1
    [dead] = _said(caplog, f"job {job.task_id} failed for good (lease_expired)")
    assert (dead.levelno, getattr(dead, "event", None)) == (logging.WARNING, "dead_lettered")


def _noop_app(store: Any) -> Backburner:
    """An app on ``store`` (a backend, or a wrapper of one) with one task, noop."""
    bb = Backburner(store, settings=WORKER_TEST_SETTINGS)

    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    return bb


class _IdleWaitRefused:
    """Claims work (and find nothing); every wait for jobs fails, as a full Redis refuses
    the idle registration of a worker that found nothing."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.waits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def wait_for_jobs(self, **kw: Any) -> list[Job]:
        self.waits += 1
        raise BackendError("OOM command not allowed when used memory > 'maxmemory'")


async def test_a_wait_for_work_that_fails_backs_off(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # A claim that worked and a wait that did not looped with no pause: 18 warnings a second.
    store = _IdleWaitRefused(backend)
    bb = _noop_app(store)
    async with running_worker(bb):
        await eventually(lambda: store.waits >= 3, timeout=20, message="three waits")
        waits = store.waits
        await asyncio.sleep(1.0)  # a spin would wait thousands of times in a second
        assert store.waits - waits <= 5, store.waits - waits
    assert "waiting for work failed" in caplog.text


class _CancelPollDown:
    """A backend whose cancel poll always fails, as while Redis is down."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.polls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def poll_cancellations(self, worker_id: str) -> dict[str, int]:
        self.polls += 1
        raise BackendError("Redis at 127.0.0.1:6379: Connection refused")


async def test_a_duty_that_keeps_failing_is_logged_once_a_streak_not_each_time(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # While Redis was down each worker logged about ten warnings a second.
    store = _CancelPollDown(backend)
    bb = _noop_app(store)
    with caplog.at_level(logging.WARNING, logger="backburner.worker"):
        async with running_worker(bb):
            await eventually(lambda: store.polls >= 30, timeout=20, message="30 polls")
    said = [r for r in caplog.records if "_poll_cancels failed" in r.getMessage()]
    assert len(said) == 1 and "(1 in a row)" in said[0].getMessage()


async def test_a_stop_during_the_first_heartbeat_on_a_locked_file_ends_the_worker_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The first heartbeat waited out SQLite's busy timeout (30 s) before it looked at the stop,
    # and the worker then logged "started" after "shutting down".
    path = tmp_path / "locked.db"
    bb = Backburner(f"sqlite:///{path}", settings=WORKER_TEST_SETTINGS)

    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    caplog.set_level(logging.INFO, logger="backburner.worker")
    await bb.connect()
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        worker = bb.worker()
        running = asyncio.create_task(worker.run())
        worker.shutdown()
        await asyncio.wait_for(running, 10)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
        await bb.close()
    assert not any(" started (" in r.getMessage() for r in caplog.records)
