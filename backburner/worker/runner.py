"""One asyncio worker process: claims jobs under leases and runs up to ``concurrency`` at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..aio import done_unless_set, wait_all_or
from ..backends.base import NextClaim, Release
from ..errors import BackburnerError, InvalidInputError, LeaseLostError
from ..models import Job
from ..observability.logs import job_fields, worth_logging
from ..webhooks.alerts import DeadLetterAlerts
from ..webhooks.dispatcher import WebhookDispatcher
from .attempt import CANCELLED, LEASE_LOST, SHUTDOWN, Attempt, execute
from .sweeper import sweep_once
from .timeouts import TIMED_OUT, CoarseTimeouts

if TYPE_CHECKING:
    from ..app import Backburner

log = logging.getLogger("backburner.worker")

CLAIMS_AHEAD = 2
"""Claims a worker sends ahead while it starts the jobs of a full one (see _claim_loop)."""


WRITE_REPLY_S = 5.0
"""How long a forced stop lets an outcome's write in flight land: a reply comes within the
Redis backend's socket timeout (5 s) or not at all."""


def claim_backoff(failures: int) -> float:
    """Seconds to wait before claiming again after ``failures`` failed claims in a row."""
    return min(5.0, 0.05 * 2.0**failures)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs jobs from the app's backend until ``shutdown()`` (or SIGTERM/SIGINT) is called.

    First shutdown: stop claiming, let running jobs finish for ``shutdown_grace_s``, then hand
    the rest back to the queue without charging their attempt. Second shutdown: hand back now.
    Only jobs of the task types registered on the app are claimed.
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
        self.running: dict[tuple[str, int], Attempt] = {}
        """The attempts in progress, by (task_id, fence)."""
        self.started = asyncio.Event()
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._last_beat = time.monotonic()
        self._handing_back: set[asyncio.Task[Any]] = set()
        """Hand-backs under way, and claims whose jobs go back as they return."""
        self._types = sorted(app.tasks)
        self._finishing: set[asyncio.Task[None]] = set()
        """Attempts whose outcome is stored, running their hooks: they hold no slot."""
        self.timeouts = CoarseTimeouts()
        """Enforces the attempts' long timeouts (the default is an hour)."""
        self.dispatcher = WebhookDispatcher(app)
        """Delivers the webhook outbox while this worker runs."""
        self._on_stored = self._stored  # (bound once: every attempt shares them)
        self._on_ended = self._finished
        self._on_hooks_ended = self._hooks_ended
        self._refill_for = self._next_claim_for

    # -- control -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Ask the worker to stop: graceful the first time, immediate the second."""
        if self._stopping.is_set():
            log.warning("second shutdown request: handing running jobs back now")
            self._force.set()
        else:
            log.info("shutting down: no new jobs; %d running", len(self.running))
            self._stopping.set()  # (what a write in flight claims is handed back as it comes)

    def cancel_local(self, task_id: str, fence: int, reason: str = CANCELLED) -> bool:
        """Cancel the asyncio task running ``task_id`` under ``fence``, if it runs here."""
        attempt = self.running.get((task_id, fence))
        if attempt is None or attempt.task is None or attempt.settled:
            return False
        if attempt.storing and reason != SHUTDOWN:
            # Its outcome is being written, fenced: the write decides, and cancelling it would
            # drop the reply (and the job it may claim for this slot).
            return False
        if attempt.stop_reason in (None, TIMED_OUT):  # (a cancel overrides a timeout, as it
            attempt.stop_reason = reason  # does asyncio.timeout's)
        attempt.task.cancel()
        return True

    # -- main loop ---------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> None:
        """Run until shut down. With ``handle_signals``, SIGTERM and SIGINT call shutdown()."""
        await self.app.connect()
        if not self.app.tasks:
            log.warning("no tasks are registered: this worker will claim nothing")
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.shutdown)
        self.app.attach_worker(self)
        background: list[asyncio.Task[None]] = []
        stop_waiter = asyncio.create_task(self._stopping.wait())
        # The webhook outbox is delivered from every worker process; it keeps going while
        # running jobs finish after a shutdown request, and stops after them.
        dispatcher = self.dispatcher
        poke = dispatcher.hook()
        self.app.hooks.hooks.append(poke)
        dispatch_stop = asyncio.Event()
        # (a second signal while deliveries drain cuts them short: their leases end, and
        # another worker sends them)
        dispatching = asyncio.create_task(dispatcher.run(dispatch_stop, hurry=self._force))
        admin_url = self.settings.admin_webhook_url
        alerts = DeadLetterAlerts(self.app, admin_url) if admin_url else None
        if alerts is not None:
            self.app.hooks.hooks.append(alerts)
        try:
            await self._first_heartbeat()
            if not self._stopping.is_set():  # (asked to stop before it started: it never did)
                background = [
                    asyncio.create_task(self._every(self.settings.heartbeat_s, self._heartbeat)),
                    asyncio.create_task(
                        self._every(self.settings.cancel_poll_s, self._poll_cancels)
                    ),
                    asyncio.create_task(self._every(self.settings.sweep_interval_s, self._sweep)),
                    asyncio.create_task(self._every(self.settings.heartbeat_s, self._orphans)),
                ]
                log.info(
                    "worker %s started (concurrency %d, event loop %s)",
                    self.worker_id,
                    self.concurrency,
                    type(asyncio.get_running_loop()).__module__.partition(".")[0],
                )
            self.started.set()
            await self._claim_loop(stop_waiter)
            await self._wind_down()
        except (asyncio.CancelledError, Exception) as exc:
            # Its task cancelled (asyncio.run does that on Ctrl-C; an app's lifespan, at its
            # end), or a bug: a forced shutdown. Running jobs go back to the queue now, not
            # after their lease (with no heartbeat left, they would only run on to be fenced
            # off), and so do the jobs claimed for this worker that it has not started.
            self._stop_now()
            if self.started.is_set():  # (before it, nothing was claimed: fail fast)
                if isinstance(exc, asyncio.CancelledError):
                    log.info("worker %s cancelled: handing its jobs back now", self.worker_id)
                else:
                    log.warning("worker %s: %r; handing its jobs back now", self.worker_id, exc)
                await self._wind_down()
            raise
        finally:
            # What needs no await first: a cancellation of what follows cannot leave the
            # heartbeat running or the hooks in place (nothing runs jobs any more).
            stop_waiter.cancel()
            for task in background:
                task.cancel()
            dispatch_stop.set()
            self.app.hooks.hooks.remove(poke)
            if alerts is not None:
                self.app.hooks.hooks.remove(alerts)
            try:
                try:
                    await asyncio.gather(dispatching, return_exceptions=True)
                except asyncio.CancelledError:
                    self._force.set()  # (cancelled while deliveries drain: alerts go too)
                    raise
                finally:
                    if alerts is not None:
                        await alerts.aclose(self.settings.webhook_timeout_s, hurry=self._force)
                await asyncio.gather(*background, stop_waiter, return_exceptions=True)
            finally:
                for sig in signals:  # (a second signal during the drains above ends them)
                    loop.remove_signal_handler(sig)
                self.app.detach_worker(self)
                log.info("worker %s stopped", self.worker_id)

    def _stop_now(self) -> None:
        """Its task was cancelled (or an error is ending it): stop as at a second signal,
        before anything else runs (a job claimed for it from now on is handed back unstarted)."""
        self._stopping.set()
        self._force.set()

    async def _wind_down(self) -> None:
        """After the claim loop: hand back what is left, once running jobs end or the grace,
        if any, runs out. Run again (its task cancelled during the first), it takes over
        what the first left: every hand-back begun is a task of its own, waited for here."""
        # A task, not an await: nothing may run before _drain has cancelled what must not.
        self._track(asyncio.create_task(self._stop_waiting()))
        await self._drain()
        # Waited for, never gathered: a cancellation of run() here must not cut them short.
        while self._handing_back:
            await asyncio.wait(set(self._handing_back))

    def _track(self, task: asyncio.Task[None]) -> None:
        """Keep a hand-back until it ends (run() waits for them all)."""
        self._handing_back.add(task)
        task.add_done_callback(self._untrack)

    def _untrack(self, task: asyncio.Task[Any]) -> None:
        self._handing_back.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("handing jobs back failed", exc_info=task.exception())

    async def _until_stopping(
        self, waitable: Awaitable[Any], stop_waiter: asyncio.Task[Any]
    ) -> Any:
        """What ``waitable`` returns, or None if it failed or the worker began stopping."""
        task = asyncio.ensure_future(waitable)
        try:
            await asyncio.wait({task, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._stop_now()  # (before the wait's own end: a job it is handed goes back)
            if task.done() and not task.cancelled() and task.exception() is None:
                for job in task.result() if isinstance(task.result(), list) else ():
                    self._hand_back_soon(job)  # (a wait for jobs that ended with some)
            raise
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            elif not task.cancelled() and task.exception() is not None:
                log.warning("waiting for work failed: %s", task.exception())
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    async def _stop_waiting(self) -> None:
        """Hand back the jobs handed to this worker that it never took (or that came as it
        stopped)."""
        try:
            leftover = await self.app.backend.stop_waiting(self.worker_id)
        except BackburnerError as exc:
            log.warning("could not stop waiting (%s); jobs handed to us run after their lease", exc)
            return
        await asyncio.gather(*(self._hand_back(job) for job in leftover))

    def _take(self, job: Job) -> None:
        """Run a job claimed for us (by a claim, a hand-off or a finish), or hand it back if
        every slot is taken (a claim of ours and a hand-off crossed) or we are stopping. One
        whose lease has ended already (handed to us as we froze: SIGSTOP, a long GC pause) is
        another worker's to run: starting it would run its side effects twice."""
        lease = job.lease_expires_at
        if lease is not None and lease <= self.app.clock.now():
            log.info(
                "job %s: its lease ended before it could start here; left to the sweeper",
                job.task_id,
                extra=job_fields(job, "lease_lost"),
            )
            return
        if len(self.running) < self.concurrency and not self._stopping.is_set():
            self._start(job)
        else:
            self._hand_back_soon(job)

    def _hand_back_soon(self, job: Job) -> None:
        """Hand a job back in a task of its own (a stopping worker awaits them all)."""
        self._track(asyncio.create_task(self._hand_back(job)))

    async def _hand_back(self, job: Job) -> None:
        """Put a job we hold back in the queue at its place, its attempt not counted."""
        try:
            await self.app.backend.finish(
                job.task_id, job.fence, Release(), now=self.app.clock.now()
            )
        except LeaseLostError:
            pass  # its own task got there first, or the job was cancelled
        except BackburnerError as exc:
            log.warning("job %s: not handed back (%s); its lease will expire", job.task_id, exc)

    async def _claim_loop(self, stop_waiter: asyncio.Task[Any]) -> None:
        settings = self.settings
        types = self._types = sorted(self.app.tasks)
        failures = waits_failed = 0
        # Claims sent before the jobs of the claim that came back before them were started:
        # that one was full, so the queue likely holds more. Redis runs them while this process
        # starts those jobs, where one claim at a time left each side idle while the other
        # worked. With their limits; together they never ask for more than the free slots.
        ahead: deque[tuple[asyncio.Task[list[Job]], int]] = deque()
        # The claim awaited: a task, shielded, so that cancelling the loop cannot cut it short
        # after Redis ran it (its jobs would wait out their lease); the finally hands them back.
        claiming: asyncio.Task[list[Job]] | None = None
        try:
            while not self._stopping.is_set():
                if ahead:
                    claiming, limit = ahead.popleft()
                else:
                    free = self.concurrency - len(self.running)
                    if free <= 0:
                        self._slot_freed.clear()
                        await self._until_stopping(self._slot_freed.wait(), stop_waiter)
                        continue
                    limit = min(free, settings.claim_batch)
                    claiming = asyncio.ensure_future(self._claim(limit))
                try:
                    jobs = await asyncio.shield(claiming)
                except BackburnerError as exc:
                    claiming = None
                    failures += 1
                    if ahead:  # (its jobs, if it got any, must not wait out a backoff)
                        log.error("claim failed (%s); taking the next one sent ahead", exc)
                        continue
                    delay = claim_backoff(failures)
                    log.error("claim failed (%s); retrying in %.2fs", exc, delay)
                    await self._until_stopping(asyncio.sleep(delay), stop_waiter)
                    continue
                claiming = None
                failures = 0
                if len(jobs) == limit:
                    room = self.concurrency - len(self.running) - len(jobs)
                    room -= sum(asked for _, asked in ahead)
                    while len(ahead) < CLAIMS_AHEAD and room > 0 and not self._stopping.is_set():
                        more = min(room, settings.claim_batch)
                        ahead.append((asyncio.ensure_future(self._claim(more)), more))
                        room -= more
                for job in jobs:  # a hand-off may have taken a slot while the claim was out
                    self._take(job)
                if self._stopping.is_set():
                    break
                if len(jobs) < limit and not ahead:
                    wait = self.app.backend.wait_for_jobs(
                        now=self.app.clock.now(),
                        timeout=settings.idle_wait_s,
                        types=types,
                        worker_id=self.worker_id,
                        lease_s=settings.lease_s,
                        on_handed=self._take,
                    )
                    handed = await self._until_stopping(wait, stop_waiter)
                    if handed is None and not self._stopping.is_set():
                        # It failed (logged): a claim that works and a wait that does not (a
                        # full Redis refuses the idle registration) looped without a pause.
                        waits_failed += 1
                        delay = claim_backoff(waits_failed)
                        await self._until_stopping(asyncio.sleep(delay), stop_waiter)
                        continue
                    waits_failed = 0
                    for job in handed or ():
                        self._take(job)
        except asyncio.CancelledError:
            self._stop_now()
            raise
        finally:
            # However the loop ended (a shutdown, its task cancelled, an error), the jobs of the
            # claim awaited and of those still ahead are handed back as each returns, by a
            # callback: nothing waits for them to be taken, and a second cancellation cannot
            # leave them leased. run() waits for them with its other hand-backs.
            pending = [task for task, _ in ahead]
            if claiming is not None:
                pending.append(claiming)
            for task in pending:
                self._handing_back.add(task)
                task.add_done_callback(self._return_claimed)

    def _claim(self, limit: int) -> Coroutine[Any, Any, list[Job]]:
        return self.app.backend.claim(
            self.worker_id,
            limit=limit,
            now=self.app.clock.now(),
            lease_s=self.settings.lease_s,
            types=self._types,
        )

    def _return_claimed(self, claiming: asyncio.Task[list[Job]]) -> None:
        """Hand back every job of a claim the claim loop ended before taking."""
        self._handing_back.discard(claiming)
        if claiming.cancelled():
            return
        error = claiming.exception()
        if error is not None:
            log.warning("a claim failed as the claim loop ended (%s)", error)
            return
        for job in claiming.result():
            self._hand_back_soon(job)

    async def _drain(self) -> None:
        if (self.running or self._finishing) and not self._force.is_set():
            tasks = [a.task for a in self.running.values() if a.task]
            await self._wait_or_force([*tasks, *self._finishing], self.settings.shutdown_grace_s)
        leftover = list(self.running.values())
        if not leftover:
            await self._end_hooks()
            return
        log.info("handing %d unfinished jobs back to the queue", len(leftover))
        for attempt in leftover:
            # A job whose outcome is being written is done, and the write may claim this
            # worker's next jobs, which only its reply names (cut short, they would wait out
            # their lease): it gets up to 10 s to land, or WRITE_REPLY_S once the stop is
            # forced.
            if not attempt.storing:
                self.cancel_local(attempt.job.task_id, attempt.job.fence, SHUTDOWN)
        tasks = [a.task for a in leftover if a.task is not None]
        loop = asyncio.get_running_loop()
        ends = loop.time() + 10.0  # (a force that comes late in the 10 s does not extend it)
        if tasks and not self._force.is_set():
            await self._wait_or_force(tasks, 10.0)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)  # (those cancelled now hand themselves back)
        writing = [a.task for a in leftover if a.storing and a.task and not a.task.done()]
        more = min(WRITE_REPLY_S - 1.0, ends - loop.time())
        if writing and self._force.is_set() and more > 0:
            await asyncio.wait(writing, timeout=more)
        late = [a for a in leftover if a.storing and a.task and not a.task.done()]
        for attempt in late:
            self.cancel_local(attempt.job.task_id, attempt.job.fence, SHUTDOWN)
        if late:
            await asyncio.wait([a.task for a in late if a.task], timeout=1.0)
        # One still running (its handler held on through its cancellation) is handed back
        # here; one that ended without settling was handed back as it ended (_finished).
        stuck = [a for a in leftover if not a.settled and a.task and not a.task.done()]
        releasing = [asyncio.create_task(self._release(a)) for a in stuck]
        for task in releasing:
            self._track(task)
        if releasing:
            await asyncio.wait(releasing)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await self._end_hooks()

    async def _end_hooks(self) -> None:
        """Hooks still running after the grace (or a forced stop) are cut short."""
        finishing = list(self._finishing)
        for task in finishing:
            task.cancel()
        if finishing:
            await asyncio.wait(finishing, timeout=1.0)

    async def _release(self, attempt: Attempt) -> None:
        await self._hand_back(attempt.job)
        attempt.settled = True

    async def _wait_or_force(self, tasks: list[asyncio.Task[None]], timeout: float) -> None:
        """Until every task is done, a forced stop or ``timeout`` seconds, whichever is first."""
        await wait_all_or(tasks, self._force, timeout)

    # -- one job -----------------------------------------------------------------------------

    def _start(self, job: Job) -> None:
        attempt = Attempt(
            job,
            registered=time.monotonic(),
            refill_for=self._refill_for,
            on_stored=self._on_stored,
            timeouts=self.timeouts,
            on_hooks_ended=self._on_hooks_ended,
            on_ended=self._on_ended,
        )
        self.running[attempt.key] = attempt
        task = attempt.task = asyncio.create_task(
            execute(self.app, attempt), name=f"backburner:{job.task_id}"
        )
        task.add_done_callback(attempt.ended)

    def _stored(self, attempt: Attempt) -> None:
        """Its outcome is written: its slot goes to what the write claimed (before the claim
        loop sees it free), while it runs its hooks on the side. Once hooks run beside as many
        jobs as the worker runs, it keeps its slot until its hooks end: slow hooks slow the
        worker down rather than pile up."""
        if (
            len(self._finishing) < self.concurrency
            and self.running.pop(attempt.key, None) is not None
        ):
            if attempt.task is not None:
                self._finishing.add(attempt.task)
            self._slot_freed.set()
        self._take_claimed(attempt.refill)

    def _next_claim_for(self, attempt: Attempt) -> NextClaim | None:
        """Asked as an attempt's outcome is written: its write claims the job that takes its
        slot next (while the queue has work, a busy worker makes no claims of its own), unless
        the worker stops or hooks already hold as many slots as it has (then the slot is not
        freed when the outcome is stored: a job claimed for it would only be handed back)."""
        if self._stopping.is_set() or len(self._finishing) >= self.concurrency:
            return None
        if attempt.refill is None:
            attempt.refill = NextClaim(self.worker_id, self.settings.lease_s, self._types)
        return attempt.refill

    def _hooks_ended(self, attempt: Attempt) -> None:
        if attempt.task is not None:
            self._finishing.discard(attempt.task)

    def _take_claimed(self, refill: NextClaim | None) -> None:
        """Start (or hand back) what a finish claimed for us, once."""
        if refill is not None and refill.jobs:
            jobs, refill.jobs = refill.jobs, []
            for job in jobs:
                self._take(job)

    def _finished(self, attempt: Attempt) -> None:
        task = attempt.task
        assert task is not None
        self._finishing.discard(task)
        if self.running.pop(attempt.key, None) is not None:
            self._slot_freed.set()
        # A write that claimed jobs and then failed (its reply unreadable, say) never got to
        # _stored: those jobs are ours all the same.
        self._take_claimed(attempt.refill)
        if not attempt.settled and self._stopping.is_set():
            # Ended without a word stored (cancelled before its first step, its write failed):
            # handed back now, as it leaves self.running, where a later wind-down (after a
            # cancellation of the one under way) would no longer find it.
            self._track(asyncio.create_task(self._release(attempt)))
        if not task.cancelled() and task.exception() is not None:
            log.error("job %s: worker bug", attempt.job.task_id, exc_info=task.exception())

    # -- background duties -------------------------------------------------------------------

    async def _every(self, interval: float, duty: Callable[[], Awaitable[None]]) -> None:
        failed = 0  # in a row: a backend that is down is said once a streak, then now and then
        while True:
            await asyncio.sleep(interval)
            try:
                await duty()
            except Exception as exc:
                failed += 1
                if worth_logging(failed):  # (the cancel poll alone runs 4 times a second)
                    if isinstance(exc, BackburnerError):
                        log.warning("%s failed (%d in a row): %s", duty.__name__, failed, exc)
                    else:  # (a bug: its traceback, but not four times a second either)
                        log.exception("%s failed (%d in a row)", duty.__name__, failed)
                continue
            if failed:
                log.info("%s works again after %d failures", duty.__name__, failed)
                failed = 0

    async def _first_heartbeat(self) -> None:
        """The heartbeat that registers this worker, retried while the backend cannot take it
        (down, or a SQLite file locked by another process) until it does or the worker is
        asked to stop: a worker started during an outage waits it out. (Under ``serve`` one
        that gave up left the API answering, ready, with no worker: jobs stayed queued.)"""
        failed = 0
        while True:
            beat = asyncio.ensure_future(self._heartbeat())
            # A stop asked meanwhile ends the wait: a SQLite file locked by another process held
            # a SIGTERM for up to its busy timeout, 30 s.
            if not await done_unless_set(beat, self._stopping):
                return  # (stopping: its claim loop sees the stop at once)
            try:
                beat.result()
            except BackburnerError as exc:
                failed += 1
                if worth_logging(failed):
                    log.warning(
                        "worker %s cannot start yet (%s; %d in a row); trying again",
                        self.worker_id,
                        exc,
                        failed,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), claim_backoff(failed))
                if self._stopping.is_set():
                    return  # (its claim loop sees the stop at once)
                continue
            if failed:
                log.info("worker %s started after %d failed tries", self.worker_id, failed)
            return

    async def _heartbeat(self) -> None:
        issued = time.monotonic()
        # Settled attempts (their outcome stored) need no lease; renew only what still runs.
        held = {
            task_id: fence
            for (task_id, fence), attempt in self.running.items()
            if not attempt.settled
        }
        try:
            renewed = await self.app.backend.heartbeat(
                self.worker_id, held, now=self.app.clock.now(), lease_s=self.settings.lease_s
            )
        except BackburnerError:
            if time.monotonic() - self._last_beat > self.settings.lease_s:
                # Our leases have expired by now: others may run these jobs; stop wasting work.
                for task_id, fence in held.items():
                    self.cancel_local(task_id, fence, LEASE_LOST)
            raise
        self._last_beat = issued
        for task_id, fence in held.items():
            # An attempt that finished during the round trip is not renewed, and not lost.
            attempt = self.running.get((task_id, fence))
            if renewed.get(task_id) != fence and self.cancel_local(task_id, fence, LEASE_LOST):
                assert attempt is not None  # (cancel_local found it)
                log.warning(
                    "job %s: lease lost; stopped it",
                    task_id,
                    extra=job_fields(attempt.job, "lease_lost"),
                )

    async def _orphans(self) -> None:
        """Cancel the children running here whose parent has ended: a parent's cancel (or
        failure) cancels its children in the process that made it, and one that died part-way
        left the rest running to an end nobody reads. One status read a parent, not a child."""
        parents: dict[str, list[str]] = {}
        for attempt in self.running.values():
            parent = attempt.job.parent_id
            if parent is not None and not attempt.settled:
                parents.setdefault(parent, []).append(attempt.job.task_id)
        for parent, children in parents.items():
            status = await self.app.backend.job_status(parent)
            if status is None or status.is_terminal:
                for task_id in children:
                    with contextlib.suppress(BackburnerError):  # (ended meanwhile: fine)
                        await self.app.cancel(task_id)

    async def _poll_cancels(self) -> None:
        signals = await self.app.backend.poll_cancellations(self.worker_id)
        for task_id, fence in signals.items():
            self.cancel_local(task_id, fence, CANCELLED)

    async def _sweep(self) -> None:
        await sweep_once(self.app)
