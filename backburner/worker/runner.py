"""One asyncio worker process: claims jobs under leases and runs up to ``concurrency`` at once."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..backends.base import Complete, Fail, Outcome, Release, RetryAt
from ..context import JobContext, _current
from ..errors import BackburnerError, InvalidInputError, LeaseLostError
from ..models import ErrorInfo, Job
from .sweeper import sweep_once

if TYPE_CHECKING:
    from ..app import Backburner

log = logging.getLogger("backburner.worker")

SHUTDOWN = "shutdown"
CANCELLED = "cancelled"
LEASE_LOST = "lease_lost"


@dataclass(slots=True)
class _Running:
    job: Job
    task: asyncio.Task[None]
    registered: float = field(default_factory=time.monotonic)
    reason: str | None = None


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs jobs from the app's backend until ``shutdown()`` (or SIGTERM/SIGINT) is called.

    First shutdown: stop claiming, let running jobs finish for ``shutdown_grace_s``, then hand
    the rest back to the queue without charging their attempt. Second shutdown: hand back now.
    """

    def __init__(
        self, app: Backburner, *, concurrency: int | None = None, worker_id: str | None = None
    ) -> None:
        self.app = app
        self.settings = app.settings
        self.concurrency = concurrency or self.settings.concurrency
        if self.concurrency <= 0:
            raise InvalidInputError("concurrency must be > 0")
        self.worker_id = worker_id or default_worker_id()
        self.running: dict[tuple[str, int], _Running] = {}
        """The attempts in progress, by (task_id, fence)."""
        self.started = asyncio.Event()
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._last_beat = time.monotonic()

    # -- control -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Ask the worker to stop: graceful the first time, immediate the second."""
        if self._stopping.is_set():
            log.warning("second shutdown request: handing running jobs back now")
            self._force.set()
        else:
            log.info("shutting down: no new jobs; %d running", len(self.running))
            self._stopping.set()

    def cancel_local(self, task_id: str, fence: int, reason: str = CANCELLED) -> bool:
        """Cancel the asyncio task running ``task_id`` under ``fence``, if it runs here."""
        running = self.running.get((task_id, fence))
        if running is None:
            return False
        if running.reason is None:
            running.reason = reason
        running.task.cancel()
        return True

    # -- main loop ---------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> None:
        """Run until shut down. With ``handle_signals``, SIGTERM and SIGINT call shutdown()."""
        await self.app.connect()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.shutdown)
        self.app._workers.add(self)
        await self._heartbeat()
        background = [
            asyncio.create_task(self._every(self.settings.heartbeat_s, self._heartbeat)),
            asyncio.create_task(self._every(self.settings.cancel_poll_s, self._poll_cancels)),
            asyncio.create_task(self._every(self.settings.sweep_interval_s, self._sweep)),
        ]
        stop_waiter = asyncio.create_task(self._stopping.wait())
        self.started.set()
        log.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)
        try:
            await self._claim_loop(stop_waiter)
            await self._drain()
        finally:
            stop_waiter.cancel()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, stop_waiter, return_exceptions=True)
            for sig in signals:
                loop.remove_signal_handler(sig)
            self.app._workers.discard(self)
            log.info("worker %s stopped", self.worker_id)

    async def _until_stopping(
        self, waitable: Awaitable[Any], stop_waiter: asyncio.Task[Any]
    ) -> None:
        task = asyncio.ensure_future(waitable)
        try:
            await asyncio.wait({task, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            elif not task.cancelled() and task.exception() is not None:
                log.warning("waiting for work failed: %s", task.exception())

    async def _claim_loop(self, stop_waiter: asyncio.Task[Any]) -> None:
        settings = self.settings
        backend = self.app.backend
        clock = self.app.clock
        failures = 0
        while not self._stopping.is_set():
            free = self.concurrency - len(self.running)
            if free <= 0:
                self._slot_freed.clear()
                await self._until_stopping(self._slot_freed.wait(), stop_waiter)
                continue
            limit = min(free, settings.claim_batch)
            try:
                jobs = await backend.claim(
                    self.worker_id, limit=limit, now=clock.now(), lease_s=settings.lease_s
                )
            except BackburnerError as exc:
                failures += 1
                delay = min(5.0, 0.05 * 2**failures)
                log.error("claim failed (%s); retrying in %.2fs", exc, delay)
                await self._until_stopping(asyncio.sleep(delay), stop_waiter)
                continue
            failures = 0
            for job in jobs:
                self._start(job)
            if len(jobs) < limit:
                wait = self.app.backend.wait_for_jobs(now=clock.now(), timeout=settings.idle_wait_s)
                await self._until_stopping(wait, stop_waiter)

    async def _drain(self) -> None:
        if self.running and not self._force.is_set():
            force = asyncio.create_task(self._force.wait())
            await self._wait_tasks_or_force([r.task for r in self.running.values()], force)
            force.cancel()
        leftover = list(self.running.values())
        for running in leftover:
            self.cancel_local(running.job.task_id, running.job.fence, SHUTDOWN)
        if leftover:
            log.info("handing %d unfinished jobs back to the queue", len(leftover))
            await asyncio.wait(
                [r.task for r in leftover], timeout=1.0 if self._force.is_set() else 10.0
            )

    async def _wait_tasks_or_force(
        self, tasks: list[asyncio.Task[None]], force: asyncio.Task[Any]
    ) -> None:
        all_done = asyncio.ensure_future(asyncio.wait(tasks))
        try:
            await asyncio.wait(
                {all_done, force},
                timeout=self.settings.shutdown_grace_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            all_done.cancel()

    # -- one job -----------------------------------------------------------------------------

    def _start(self, job: Job) -> None:
        task = asyncio.create_task(self._execute(job), name=f"backburner:{job.task_id}")
        key = (job.task_id, job.fence)
        self.running[key] = _Running(job, task)
        task.add_done_callback(lambda done: self._finished(key, done))

    def _finished(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        self.running.pop(key, None)
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("job %s: worker bug", key[0], exc_info=task.exception())

    async def _execute(self, job: Job) -> None:
        app = self.app
        clock = app.clock
        ctx = JobContext(job, app.backend, clock)
        _current.set(ctx)
        await app.hooks.start(job)
        outcome = await self._attempt(job, ctx)
        if outcome is None:
            return
        try:
            try:
                stored = await app.backend.finish(job.task_id, job.fence, outcome, now=clock.now())
            except InvalidInputError as exc:  # the backend could not encode the result
                error = ErrorInfo(type="invalid_result", message=str(exc), retryable=False)
                outcome = Fail(error, max(job.ttl_s, app.retry_policy.dead_letter_ttl_s))
                stored = await app.backend.finish(job.task_id, job.fence, outcome, now=clock.now())
        except LeaseLostError:
            log.info("job %s: lease lost before its outcome was written; dropped", job.task_id)
            return
        except BackburnerError as exc:
            log.error(
                "job %s: could not store the outcome (%s); its lease will expire and"
                " the sweeper will re-queue it",
                job.task_id,
                exc,
            )
            return
        if isinstance(outcome, Complete):
            await app.hooks.complete(stored)
        elif isinstance(outcome, Fail):
            await app.hooks.fail(stored)
        elif isinstance(outcome, RetryAt):
            await app.hooks.retry(stored, outcome.error)

    async def _attempt(self, job: Job, ctx: JobContext) -> Outcome | None:
        """Run the handler once; None means nothing may be written (cancelled or lease lost)."""
        app = self.app
        policy = app.retry_policy
        definition = app.tasks.get(job.type)
        now = app.clock.now()
        try:
            if definition is None:
                raise _FailNowError("unknown_task", f"no task named {job.type!r} in this worker")
            if job.deadline_at is not None and now >= job.deadline_at:
                raise _FailNowError("deadline_exceeded", "the job's deadline passed before it ran")
            try:
                definition.check_input(job.input)
            except InvalidInputError as exc:
                raise _FailNowError("invalid_input", str(exc)) from None
            timeout = job.timeout_s
            if job.deadline_at is not None:
                left = job.deadline_at - now
                timeout = left if timeout is None else min(timeout, left)
            async with asyncio.timeout(timeout):
                result = await definition.call(ctx, job.input)
            return Complete(result, usage=ctx.usage or None)
        except asyncio.CancelledError:
            running = self.running.get((job.task_id, job.fence))
            reason = running.reason if running is not None else None
            if reason == SHUTDOWN:
                return Release()
            if reason in (CANCELLED, LEASE_LOST):
                log.info("job %s: stopped (%s)", job.task_id, reason)
                return None
            raise
        except _FailNowError as exc:
            return Fail(exc.error, max(job.ttl_s, policy.dead_letter_ttl_s))
        except Exception as exc:
            error, delay = policy.classify(exc, definition)
            log.info(
                "job %s attempt %d failed: %s: %s",
                job.task_id,
                job.attempts,
                error.type,
                error.message,
            )
            return policy.after_failure(job, error, delay, now=app.clock.now())

    # -- background duties -------------------------------------------------------------------

    async def _every(self, interval: float, duty: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await duty()
            except BackburnerError as exc:
                log.warning("%s failed: %s", duty.__name__, exc)
            except Exception:
                log.exception("%s failed", duty.__name__)

    async def _heartbeat(self) -> None:
        issued = time.monotonic()
        try:
            held = await self.app.backend.heartbeat(
                self.worker_id,
                now=self.app.clock.now(),
                lease_s=self.settings.lease_s,
                running=len(self.running),
            )
        except BackburnerError:
            if time.monotonic() - self._last_beat > self.settings.lease_s:
                # Our leases have expired by now: others may run these jobs; stop wasting work.
                for running in list(self.running.values()):
                    self.cancel_local(running.job.task_id, running.job.fence, LEASE_LOST)
            raise
        self._last_beat = issued
        for (task_id, fence), running in list(self.running.items()):
            # A job registered after the heartbeat was issued may not be in its answer yet.
            if running.registered < issued and held.get(task_id) != fence:
                log.warning("job %s: lease lost; stopping it", task_id)
                self.cancel_local(task_id, fence, LEASE_LOST)

    async def _poll_cancels(self) -> None:
        signals = await self.app.backend.poll_cancellations(self.worker_id)
        for task_id, fence in signals.items():
            self.cancel_local(task_id, fence, CANCELLED)

    async def _sweep(self) -> None:
        await sweep_once(self.app)


class _FailNowError(Exception):
    def __init__(self, type: str, message: str) -> None:
        super().__init__(message)
        self.error = ErrorInfo(type=type, message=message, retryable=False)
