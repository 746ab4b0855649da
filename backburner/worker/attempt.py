"""One attempt of one job: run the handler, turn what happened into an outcome, store it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backends.base import Complete, Fail, NextClaim, Outcome, Release, RetryAt, Wait
from ..context import JobContext, activate
from ..errors import (
    BackendError,
    CorruptRecordError,
    InvalidInputError,
    LeaseLostError,
    Suspend,
    WaitForChildren,
)
from ..models import ErrorInfo, Job, same_attempt
from ..observability.logs import job_fields
from .timeouts import TIMED_OUT, CoarseTimeouts

if TYPE_CHECKING:
    from ..app import Backburner

log = logging.getLogger("backburner.worker")

SHUTDOWN = "shutdown"
CANCELLED = "cancelled"
LEASE_LOST = "lease_lost"


@dataclass(slots=True, eq=False)  # (hashed by identity: CoarseTimeouts keeps sets of them)
class Attempt:
    """An attempt a worker runs: the claimed job, its asyncio task and what became of it."""

    job: Job
    registered: float
    task: asyncio.Task[None] | None = None
    stop_reason: str | None = None
    """Why the worker cancelled it: SHUTDOWN, CANCELLED or LEASE_LOST."""
    settled: bool = False
    """True once its outcome is stored, or once nothing may be stored for it any more."""
    refill: NextClaim | None = None
    """Where the jobs claimed with its outcome arrive (None: its write claimed none)."""
    refill_for: Callable[[Attempt], NextClaim | None] | None = None
    """Asked as its outcome is written: the claim that write makes for the slot it frees,
    or None (the worker's: none while it stops or while hooks hold as many slots as it has).
    Asked then, not at its start: only then does the worker know whose hooks still run."""
    storing: bool = False
    """True while its outcome is being written: the fenced write decides what becomes of it,
    so only a forced shutdown stops it then."""
    on_stored: Callable[[Attempt], None] | None = None
    """Called once its outcome is stored, before its hooks run (the worker frees its slot and
    starts what the write claimed for it)."""
    timeouts: CoarseTimeouts | None = None
    """The worker's enforcer of long timeouts (None: asyncio.timeout for every timeout)."""
    on_hooks_ended: Callable[[Attempt], None] | None = None
    """Called in its task as the hooks for its stored outcome end (or are cut short)."""
    on_ended: Callable[[Attempt], None] | None = None
    """Called once its task is done (the worker's; one bound method for every attempt, where
    a closure per attempt cost a worker holding 10,000 jobs 4 MB)."""

    @property
    def key(self) -> tuple[str, int]:
        """Its key among the worker's running attempts: (task_id, fence)."""
        return (self.job.task_id, self.job.fence)

    def ended(self, task: asyncio.Task[None]) -> None:
        """Its task's done callback."""
        if self.on_ended is not None:
            self.on_ended(self)


class _FailNowError(Exception):
    def __init__(self, type: str, message: str) -> None:
        super().__init__(message)
        self.error = ErrorInfo(type=type, message=message, retryable=False)


async def execute(app: Backburner, attempt: Attempt) -> None:
    """The body of an attempt's asyncio task."""
    job = attempt.job
    ctx = JobContext(
        job,
        app.backend,
        app.clock,
        models=app.models,
        limits=app.model_limits,
        on_webhook=app.poke_webhooks,
        tracing=app.tracing,
        ride_out_s=app.settings.lease_s,
    )
    if job.usage is not None and same_attempt(job.history):
        # The usage of the attempt's earlier runs (a pipeline that parked, then maybe was
        # handed back): their calls count.
        ctx.usage = job.usage.model_dump()
    activate(ctx)
    app.tracing.queue_wait(job)
    try:
        await app.hooks.start(job)
        if attempt.stop_reason is not None:  # a start hook cancelled it (a child of an ended
            await asyncio.sleep(0)  # pipeline): the cancel lands here, before the handler runs
        if app.tracing.enabled:
            with app.tracing.run(job) as span:
                outcome = await _run_handler(app, attempt, ctx)
                if isinstance(outcome, Fail | RetryAt):
                    app.tracing.failed(span, outcome.error.type, outcome.error.message)
        else:  # (every job pays for a context manager that does nothing)
            outcome = await _run_handler(app, attempt, ctx)
    except asyncio.CancelledError:
        outcome = _after_cancel(attempt, ctx)
        if outcome is None:
            raise
    if outcome is None:
        attempt.settled = True
        return
    await store(app, attempt, outcome)


def _after_cancel(attempt: Attempt, ctx: JobContext) -> Outcome | None:
    if attempt.stop_reason == SHUTDOWN:
        # With the attempt's usage so far: the run that goes on from it counts its calls.
        return Release(usage=dict(ctx.usage))
    if attempt.stop_reason in (CANCELLED, LEASE_LOST) and not attempt.settled:
        # (Once: the handler's runner and the attempt around it both come here.)
        log.info(
            "job %s: stopped (%s)",
            attempt.job.task_id,
            attempt.stop_reason,
            extra=job_fields(attempt.job, "stopped"),
        )
        attempt.settled = True
    return None


async def _run_handler(app: Backburner, attempt: Attempt, ctx: JobContext) -> Outcome | None:
    """Run the handler once; None means nothing may be written (cancelled or lease lost)."""
    job = attempt.job
    policy = app.retry_policy
    definition = app.tasks[job.type]  # workers claim only the types they have
    now = app.clock.now()
    timed_out = False
    try:
        if job.deadline_at is not None and now >= job.deadline_at:
            when = "while it waited" if job.history else "before it ran"
            raise _FailNowError("deadline_exceeded", f"the job's deadline passed {when}")
        try:
            definition.check_input(job.input)
        except InvalidInputError as exc:
            raise _FailNowError("invalid_input", str(exc)) from None
        timeout = job.timeout_s
        if job.deadline_at is not None:
            left = job.deadline_at - now
            timeout = left if timeout is None else min(timeout, left)
        timeouts = attempt.timeouts
        if timeout is None:  # (asyncio.timeout(None) costs every job a Timeout for nothing)
            result = await definition.call(ctx, job.input)
        elif timeouts is None or timeout < timeouts.min_timeout_s:
            async with asyncio.timeout(timeout) as limit:
                result = await definition.call(ctx, job.input)
            if limit.expired():  # (the handler caught its cancellation and returned: too late)
                raise TimeoutError
        else:
            slot = timeouts.arm(attempt, timeout)
            try:
                result = await definition.call(ctx, job.input)
            finally:
                timeouts.disarm(attempt, slot)
                # Whatever came out (a result, the cancellation, another exception), the
                # cancellation is taken back, as asyncio.timeout's __aexit__ does.
                timed_out = attempt.stop_reason == TIMED_OUT
                if timed_out:
                    attempt.stop_reason = None
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()
            if timed_out:  # (as above: a result past the timeout is not stored)
                raise TimeoutError
        return Complete(result, usage=ctx.usage or None)
    except asyncio.CancelledError as exc:
        if timed_out:  # the timeout's own cancellation: a TimeoutError, as asyncio.timeout's
            return _failure(app, attempt, TimeoutError())
        task = asyncio.current_task()
        if attempt.stop_reason is None and task is not None and not task.cancelling():
            # The handler raised CancelledError itself (nobody cancelled us): a failure.
            return _failure(app, attempt, exc)
        outcome = _after_cancel(attempt, ctx)
        if outcome is None:
            raise
        return outcome
    except _FailNowError as exc:
        _log_failed_attempt(job, exc.error)
        return Fail(exc.error, max(job.ttl_s, policy.dead_letter_ttl_s))
    except Suspend as exc:
        run_at = app.clock.now() + exc.after
        if job.deadline_at is not None:  # (then it runs to fail, and its children go too)
            run_at = min(run_at, job.deadline_at)
        return Wait(
            run_at,
            exc.reason,
            children=isinstance(exc, WaitForChildren),
            usage=dict(ctx.usage),  # ({} clears what an earlier attempt left)
        )
    except Exception as exc:
        return _failure(app, attempt, exc)


def _failure(app: Backburner, attempt: Attempt, exc: BaseException) -> Outcome:
    job = attempt.job
    error, delay = app.retry_policy.classify(exc, app.tasks.get(job.type))
    _log_failed_attempt(job, error)
    return app.retry_policy.after_failure(job, error, delay, now=app.clock.now())


def _log_failed_attempt(job: Job, error: ErrorInfo) -> None:
    log.info(
        "job %s attempt %d failed: %s: %s",
        job.task_id,
        job.attempts,
        error.type,
        error.message,
        extra=job_fields(job, "attempt_failed"),
    )


_OUTCOME_RECORD = {
    Complete: "completed",
    Fail: "failed",
    RetryAt: "retry",
    Release: "released",
    Wait: "waiting",
}


async def _landed(app: Backburner, job: Job, outcome: Outcome) -> Job | None:
    """The job as our outcome left it, if a write whose reply was lost did land; else None."""
    try:
        now = await app.backend.get(job.task_id)
    except BackendError:
        return None
    if now is None or now.fence != job.fence or not now.history:
        return None
    last = now.history[-1]
    expected_error = outcome.error if isinstance(outcome, Fail | RetryAt) else None
    if last.outcome != _OUTCOME_RECORD[type(outcome)] or last.error != expected_error:
        return None
    return now


async def store(app: Backburner, attempt: Attempt, outcome: Outcome) -> None:
    """Write the outcome (fenced), then run the hooks for it."""
    job = attempt.job
    attempt.storing = True
    try:
        stored = await _write(app, attempt, outcome)
    finally:
        attempt.storing = False
    if stored is None:
        return
    outcome, stored_job = stored
    attempt.settled = True
    if attempt.on_stored is not None:
        attempt.on_stored(attempt)
    try:
        # A child may have ended between a pipeline's look at its children and this write, so
        # its hook's wake found the pipeline still processing: looking once more closes that.
        # (Only then: a plain Suspend's job, which has no children, waits out its time.)
        waiting = isinstance(outcome, Wait) and outcome.children
        if waiting and not await app.backend.has_open_children(job.task_id):
            await app.backend.wake(job.task_id, now=app.clock.now())
        if isinstance(outcome, Complete):
            await app.hooks.complete(stored_job)
        elif isinstance(outcome, Fail):
            log.warning(
                "job %s failed for good (%s): it is in the dead-letter queue",
                job.task_id,
                outcome.error.type,
                extra=job_fields(stored_job, "dead_lettered"),
            )
            await app.hooks.fail(stored_job)
        elif isinstance(outcome, RetryAt):
            await app.hooks.retry(stored_job, outcome.error)
    finally:
        # (Before its task's done callback, a loop turn or more later: the worker's count of
        # hooks running is exact when the next write asks it.)
        if attempt.on_hooks_ended is not None:
            attempt.on_hooks_ended(attempt)


async def _write(app: Backburner, attempt: Attempt, outcome: Outcome) -> tuple[Outcome, Job] | None:
    """Write the outcome (fenced), retrying while the lease may hold; the outcome written and
    the job as it left it, or None if nothing was (or may be) written."""
    job = attempt.job
    dead_letter_ttl = max(job.ttl_s, app.retry_policy.dead_letter_ttl_s)
    # A BackendError says nothing about the job: retry the same outcome while our lease may
    # still hold, then give up without settling (the lease expires, the job runs again).
    give_up = time.monotonic() + app.settings.lease_s
    delay = 0.05
    failures = 0
    retried = False
    while True:
        try:
            stored = await app.backend.finish(
                job.task_id,
                job.fence,
                outcome,
                now=app.clock.now(),
                claimed=job,
                then_claim=None if attempt.refill_for is None else attempt.refill_for(attempt),
            )
            break
        except LeaseLostError:
            # After a lost reply, "lease lost" may just be our own earlier write.
            landed = await _landed(app, job, outcome) if retried else None
            if landed is not None:
                stored = landed
                break
            log.info(
                "job %s: lease lost before its outcome was written; dropped",
                job.task_id,
                extra=job_fields(job, "lease_lost"),
            )
            attempt.settled = True
            return None
        except InvalidInputError as exc:  # the result or usage cannot be stored
            if isinstance(outcome, Fail):
                raise
            error = ErrorInfo(type="invalid_result", message=str(exc), retryable=False)
            _log_failed_attempt(job, error)
            outcome = Fail(error, dead_letter_ttl)
        except CorruptRecordError as exc:  # written, but the job cannot be read back
            log.error(
                "job %s: outcome stored, but %s",
                job.task_id,
                exc.args[0].partition(": ")[2],
                extra=job_fields(job, "outcome_unreadable"),
            )
            attempt.settled = True
            return None
        except BackendError as exc:
            if isinstance(outcome, Release) or time.monotonic() + delay > give_up:
                log.warning(
                    "job %s: outcome not stored (%s); the job runs again when its lease expires",
                    job.task_id,
                    exc,
                    extra=job_fields(job, "outcome_not_stored"),
                )
                return None
            log.info(
                "job %s: outcome not stored (%s); retrying in %.2fs",
                job.task_id,
                exc,
                delay,
                extra=job_fields(job, "outcome_retry"),
            )
            retried = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        except Exception as exc:  # a bug, not the storage: fail the job rather than loop
            failures += 1
            log.exception(
                "job %s: could not store its outcome",
                job.task_id,
                extra=job_fields(job, "outcome_error"),
            )
            if isinstance(outcome, Release | Wait) or failures > 1:
                return None  # the lease will expire and the sweeper re-queues the job
            error = ErrorInfo(type="internal_error", message=f"outcome not stored: {exc}")
            outcome = Fail(error, dead_letter_ttl)
    return outcome, stored
