"""The storage contract every backend implements, and the values that cross it.

A backend performs atomic storage transitions and nothing else: retry delays, attempt budgets,
deadlines and hooks are decided above it (``Backburner`` in app.py, the worker's retry policy
and sweeper), in one place for every backend. Every
backend passes the conformance suite in ``tests/conformance``.

Times are Unix seconds passed in by the caller (``now``), never read inside a backend, so a
test can drive a backend with a controllable clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidInputError
from ..models import (
    NO_PROGRESS,
    ErrorInfo,
    Event,
    Job,
    JobStatus,
    Progress,
    WebhookAttempt,
    WebhookDelivery,
    WebhookStatus,
    checked_job,
)

CURSOR = re.compile(r"[0-9]{1,18}")
"""What a listing cursor looks like: the position of the last job of a page."""


def parse_cursor(cursor: str | None) -> int | None:
    """The position a cursor names; InvalidInputError for one no backend hands out."""
    if cursor is None:
        return None
    if not CURSOR.fullmatch(cursor):
        raise InvalidInputError(f"invalid cursor {cursor!r}")
    return int(cursor)


def uuid4_hex() -> str:
    """The 32 hex digits of a random uuid4 (122 random bits), as ``uuid.uuid4().hex`` gives
    them in a third of its time (a producer makes one per job)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()


def new_task_id() -> str:
    """A random id with 122 bits of entropy (uuid4): never sequential, never guessable."""
    return "task_" + uuid4_hex()


def fingerprint(task_type: str, payload: dict[str, Any]) -> str:
    """A stable digest of what a job does, to tell a repeated request from a different one."""
    canonical = json.dumps([task_type, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def replayable(status: str, cancelled_too: bool) -> bool:
    """Whether a job of ``status`` (a JobStatus or its text) may be replayed: failed, or with
    ``cancelled_too`` cancelled as well (Backend.replay)."""
    return status == "failed" or (cancelled_too and status == "cancelled")


def check_slot_args(
    key: str, holder: str | None = None, *, limit: int | None = None, lease_s: float | None = None
) -> None:
    """Refuse what no slot call accepts (InvalidInputError), the same way in every backend: an
    empty ``key`` or ``holder``, a ``limit`` below 1, a ``lease_s`` that is not a positive
    finite number."""
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"a slot key must be a non-empty string, not {key!r}")
    if holder is not None and (not isinstance(holder, str) or not holder):
        raise InvalidInputError(f"a slot holder must be a non-empty string, not {holder!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"a slot limit must be an integer >= 1, not {limit!r}")
    if lease_s is not None and (
        isinstance(lease_s, bool)
        or not isinstance(lease_s, int | float)
        or not math.isfinite(lease_s)
        or lease_s <= 0
    ):
        raise InvalidInputError(f"a slot lease must be a number of seconds > 0, not {lease_s!r}")


DEFAULT_TENANT = "default"
"""The tenant of jobs submitted without one: library calls and the keyless API."""

CHILD_KEEP_S = 3600.0
"""A child (a pipeline's or a batch's) whose expiry comes while its parent is stored is kept
until its parent's expiry, or, its parent still running, for this long again: a batch's
results and a pipeline's replay need their children (purge_expired)."""

WORKER_RETENTION_S = 3600.0
"""How long a worker's record (stats) outlives its last heartbeat: purge_expired forgets it
after, so the records of workers that come and go (restarts, autoscaling) do not pile up."""

TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")
"""What a tenant name looks like (it appears in keys, logs and label values)."""

FAIR_SCALE = 10_000
"""The virtual time one job of a tenant of weight 1 costs (see ``fair_cost``)."""


def check_tenant(name: str) -> str:
    """``name`` if it is a valid tenant name, else InvalidInputError."""
    if type(name) is str and name == DEFAULT_TENANT:  # (the common case, without the pattern)
        return name
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        raise InvalidInputError(
            f"a tenant name is 1-64 letters, digits or . _ : @ - (starting with a letter or"
            f" digit), not {name!r}"
        )
    return name


def fair_cost(weight: float) -> int:
    """The virtual time one job of a tenant with this fair-share ``weight`` costs: a tenant of
    weight 3 gets three jobs started for every one of a tenant of weight 1 while both wait.
    InvalidInputError unless 0.01 <= weight <= 100 (so a cost is 100..1,000,000, and tags
    stay exact integers in a double for billions of jobs)."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or not 0.01 <= weight <= 100
    ):
        raise InvalidInputError(f"a tenant weight must be between 0.01 and 100, not {weight!r}")
    return max(1, round(FAIR_SCALE / weight))


@dataclass(frozen=True, slots=True)
class Quota:
    """The limits ``enqueue`` checks for the job's tenant, atomically with the insert, so
    submissions through many API processes never overshoot them. None: no limit."""

    max_in_flight: int | None = None
    """Jobs of the tenant queued or processing (delayed and retrying jobs count; a pipeline's
    children do not: they are the work of a job that was admitted)."""
    per_minute: int | None = None
    """Submissions a minute: a bucket of ``per_minute`` tokens, refilled continuously (GCRA);
    only a submission that is stored takes a token."""


@dataclass(frozen=True, slots=True)
class NewJob:
    """Everything needed to store a new job; built and validated by the engine."""

    task_id: str
    type: str
    input: dict[str, Any]
    fingerprint: str
    created_at: float
    run_at: float
    priority: int = 0
    max_attempts: int = 1
    timeout_s: float | None = None
    deadline_at: float | None = None
    ttl_s: float = 86400.0
    idempotency_key: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    webhook_url: str | None = None
    webhook_progress: bool = False
    traceparent: str | None = None
    tenant: str = DEFAULT_TENANT
    fair_cost: int = FAIR_SCALE
    """The virtual time this job costs its tenant in fair scheduling (``fair_cost(weight)``)."""
    parent_id: str | None = None
    """The pipeline job that spawned this one (a child), if any."""

    def to_job(
        self, *, input: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None
    ) -> Job:
        """The job as enqueue stores it (queued, no attempt yet), with input and metadata as
        stored (pass their JSON round trips). Its fields were checked when it was built: the
        Job is made without validating them again (``checked_job``), only given the exact
        types validation would give them (an int time a float, an enum's or str subclass's
        name a str, an IntEnum an int), so that it equals the validated one (a test keeps it
        so)."""
        return checked_job(
            {
                "task_id": _text(self.task_id),
                "type": _text(self.type),
                "status": JobStatus.QUEUED,
                "priority": int(self.priority),
                "input": self.input if input is None else input,
                "created_at": float(self.created_at),
                "run_at": float(self.run_at),
                "started_at": None,
                "finished_at": None,
                "attempts": 0,
                "max_attempts": int(self.max_attempts),
                "progress": NO_PROGRESS,
                "result": None,
                "error": None,
                "usage": None,
                "estimated_time_sec": None,
                "estimated_remaining_sec": None,
                "metadata": self.metadata if metadata is None else metadata,
                "webhook_url": _text(self.webhook_url),
                "webhook_progress": self.webhook_progress,
                "traceparent": _text(self.traceparent),
                "tenant": _text(self.tenant),
                "parent_id": _text(self.parent_id),
                "expires_at": None,
                "timeout_s": None if self.timeout_s is None else float(self.timeout_s),
                "deadline_at": None if self.deadline_at is None else float(self.deadline_at),
                "ttl_s": float(self.ttl_s),
                "idempotency_key": _text(self.idempotency_key),
                "worker_id": None,
                "lease_expires_at": None,
                "fence": 0,
                "history": [],
            }
        )


def _text(value: Any) -> Any:
    """A str as validating it gives it: the plain str of a str subclass's (an enum member's
    value); None as None. Anything else is refused, as validation would refuse it."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    raise InvalidInputError(f"expected a string, got {value!r}")


@dataclass(frozen=True, slots=True)
class Complete:
    """The attempt succeeded: the job becomes ``completed``."""

    result: Any = None
    usage: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """The job fails for good (``failed``) and shows in the dead-letter queue."""

    error: ErrorInfo
    ttl_s: float
    """How long the failed job stays (in the DLQ) before it expires."""


@dataclass(frozen=True, slots=True)
class RetryAt:
    """The attempt failed; the job goes back to ``queued`` and is due at ``run_at``."""

    error: ErrorInfo
    run_at: float


@dataclass(frozen=True, slots=True)
class Release:
    """Hand the job back to the queue without charging the attempt (graceful shutdown)."""

    reason: str = "worker shutdown"
    usage: dict[str, Any] | None = None
    """As Wait's: the usage of the attempt so far, when a run is handed back mid-way."""


@dataclass(frozen=True, slots=True)
class Wait:
    """The attempt paused (a pipeline waits for its children): the job goes back to ``queued``
    without charging the attempt, due at ``run_at`` or sooner when woken (``wake``)."""

    run_at: float
    reason: str = "waiting"
    children: bool = False
    """It waits for its children (a pipeline): woken, too, as soon as none is open."""
    usage: dict[str, Any] | None = None
    """The attempt's usage so far, stored as the job's ({}: none so far, which clears what an
    earlier attempt left; None: left as it is, for a job handed back unstarted): the next run
    of the attempt goes on from it, so a pipeline's usage counts the model calls of every
    run, not only of the last."""


Outcome = Complete | Fail | RetryAt | Release | Wait


@dataclass(slots=True)
class NextClaim:
    """A claim a worker asks ``finish`` to make for it in the same step, to fill the slot the
    finished attempt frees (``claim``'s arguments). A backend that does puts the jobs it
    claimed in ``jobs``; one that does not leaves it empty, and the worker claims itself."""

    worker_id: str
    lease_s: float
    types: Sequence[str] | None = None
    limit: int = 1
    jobs: list[Job] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a job listing; pass ``next_cursor`` back to read the next page."""

    jobs: list[Job]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    last_seen: float
    running: int
    started_at: float


@dataclass(frozen=True, slots=True)
class Stats:
    counts: dict[JobStatus, int]
    queued_by_priority: dict[int, int]
    dead_letter: int
    workers: list[WorkerInfo]
    due: int
    """Queued jobs whose time has come (at ``now``): a worker could start them now. The rest
    of the queued wait for a delay, a retry's backoff, or a parked pipeline's next look."""


@runtime_checkable
class Backend(Protocol):
    """Atomic storage of jobs, their events and leases.

    ``fence`` is the claim number of an attempt: every claim increments it, and every write a
    worker makes about a job (events, progress, its outcome) must quote the current one while
    the job is ``processing``; otherwise it raises ``LeaseLostError`` and changes nothing.
    """

    async def connect(self) -> None:
        """Open connections and create the schema. Idempotent. Raises BackendError."""

    async def close(self) -> None:
        """Release resources. Idempotent."""

    async def enqueue(self, job: NewJob, *, quota: Quota | None = None) -> tuple[Job, bool]:
        """Store a queued job and its first event; return (job, created).

        Atomic, checks in this order: BackendError if ``job.task_id`` already exists (an
        existing job is never replaced); if ``job.idempotency_key`` names an existing job,
        nothing is stored and that job is returned with created=False when its fingerprint
        matches, else IdempotencyConflictError (no quota is checked or charged for it);
        QueueFullError when the queue-size bound is reached; QuotaExceededError (retry_after
        None) when ``quota.max_in_flight`` of the tenant's jobs are queued or processing;
        SubmitRateLimitedError (with the exact retry_after) when the tenant's per-minute
        bucket is empty. Only a stored job takes a token from the bucket.

        A job due at enqueue (run_at <= created_at) joins its tenant's fair-share line now;
        a delayed one when it becomes due (see ``claim``).
        """
        ...

    async def get(self, task_id: str) -> Job | None:
        """The job, or None if it does not exist. A pure read."""
        ...

    async def job_status(self, task_id: str) -> JobStatus | None:
        """The job's status alone, or None if it does not exist: what a child that starts
        asks of its parent, whose whole record (a batch's 10,000 inputs) ``get`` would read."""
        ...

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        tenant: str | None = None,
        parent_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        """Jobs newest first, filtered (``tenant``: that tenant's only; ``parent_id``: that
        job's children, an indexed read); a pure read. Cursor pagination is stable under
        inserts.

        InvalidInputError for a cursor this backend did not hand out.
        """
        ...

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        """The job's events with seq > after, in seq order. A pure read."""
        ...

    async def claim(
        self,
        worker_id: str,
        *,
        limit: int,
        now: float,
        lease_s: float,
        types: Sequence[str] | None = None,
    ) -> list[Job]:
        """Atomically move up to ``limit`` due queued jobs to ``processing`` for this worker.

        Only jobs whose type is in ``types`` (None: any type). Highest priority first; within a
        priority, tenants share by weighted fair queueing (start-time fair queueing): when a
        job joins its tenant's line (at enqueue, a RetryAt or a replay if due then, else at
        the first claim at or after its run_at, in (run_at, enqueue order)) it gets
        the tag ``max(the tenant's last tag at that priority, the priority's clock) +
        job.fair_cost``; jobs are claimed by (tag, enqueue order), and claiming moves the
        priority's clock up to the largest tag claimed. (Each task type has a clock at each
        priority; a new one, or one in whose queue no job waits when a job joins it, starts
        level with the largest clock at that priority.) So a tenant's jobs keep their order
        (FIFO), a tenant that was idle gets no credit for it, and a new tenant's first job
        waits behind at most one job's cost of each other tenant. A Release keeps the job's
        tag, so a job handed back at shutdown is first again.
        Each claimed job gets attempts+1, fence+1, a lease until now+lease_s, a history record
        and a status event. Two claimers never get the same job.
        """
        ...

    async def heartbeat(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lease_s: float
    ) -> dict[str, int]:
        """Extend to now+lease_s the leases of the attempts in ``held`` ({task_id: fence}).

        Only those still processing under that fence for this worker are renewed — a job the
        worker holds but no longer runs is left to expire. Records the worker as alive with
        len(held) running. Returns the {task_id: fence} renewed, so the worker can stop the
        attempts it lost. Atomic; repeating it is harmless.
        """
        ...

    async def append_event(
        self,
        task_id: str,
        fence: int,
        type: str,
        data: Any,
        *,
        now: float,
        progress: Progress | None = None,
    ) -> int:
        """Append an event (and, if given, set the job's progress); return its seq.

        Fenced: raises LeaseLostError unless the job is processing under ``fence`` (before any
        other complaint, such as InvalidInputError for data that is not JSON).
        """
        ...

    async def finish(
        self,
        task_id: str,
        fence: int,
        outcome: Outcome,
        *,
        now: float,
        only_if_lease_expired: bool = False,
        claimed: Job | None = None,
        then_claim: NextClaim | None = None,
    ) -> Job:
        """Apply an attempt's outcome atomically: state, history, events, expiry.

        Fenced like append_event. With ``only_if_lease_expired`` it also requires the lease to
        have expired by ``now`` (the sweeper's guard against a heartbeat that just landed).
        Complete and Fail make the job terminal with expires_at = now + the job's ttl_s (Fail
        carries its own ttl_s, the dead-letter retention); RetryAt and Release re-queue it;
        Release also gives the attempt back (attempts-1); the fence still grows on the next
        claim. Wait is a Release due at ``outcome.run_at`` (it joins its tenant's line when
        due, like a RetryAt): history outcome "waiting", one status event ``{"status":
        "queued", "waiting": reason}``, no webhook.

        ``claimed`` is the job as the caller claimed it (claim's reply, for this fence); a
        backend may use it to build the returned Job without reading it back.

        ``then_claim``: a backend may also claim for the worker, in the same step and as
        ``claim`` would (leases of ``then_claim.lease_s`` from ``now``; a backend that batches
        finishes may use the latest ``now`` of the batch), and add those jobs to
        ``then_claim.jobs`` (only if the outcome was applied). It saves a busy worker a
        claim's round trip per job. The caller must start or release them at once: nothing
        renews their leases until it does. If ``finish`` raises after the outcome was
        applied (a lost reply), the jobs it claimed are the caller's all the same but it
        cannot know them: like the jobs of a claim whose reply is lost, they run again when
        their leases expire, each with an attempt charged.
        """
        ...

    async def cancel(self, task_id: str, *, now: float) -> tuple[Job, bool]:
        """Cancel a job; return (job, changed).

        queued or processing → cancelled at once (terminal, event appended, expiry set); for a
        processing job a signal is left for the worker holding it (see poll_cancellations).
        A terminal job is returned unchanged with changed=False (idempotent).
        JobNotFoundError if it does not exist.
        """
        ...

    async def poll_cancellations(self, worker_id: str) -> dict[str, int]:
        """Take (and clear) the cancel signals for this worker: {task_id: fence}."""
        ...

    async def replay(
        self,
        task_id: str,
        *,
        now: float,
        extra_attempts: int,
        quota: Quota | None = None,
        cancelled_too: bool = False,
    ) -> Job:
        """Re-queue a failed job with ``extra_attempts`` more attempts, keeping its history.
        QuotaExceededError (nothing changed) if its tenant has ``quota.max_in_flight`` jobs
        queued or processing (the per-minute rate does not apply). ``cancelled_too``: a
        cancelled job may be re-queued as well (a pipeline's replay runs again the children
        that its failure cancelled).

        The only way out of a terminal state; a deadline restarts from ``now`` with the same
        length. InvalidTransitionError unless failed (or cancelled, with ``cancelled_too``);
        JobNotFoundError if missing. Atomic.
        """
        ...

    async def delete(self, task_id: str) -> bool:
        """Delete a terminal job and its events now; False if it did not exist.

        InvalidTransitionError if it is not terminal.
        """
        ...

    # -- the webhook outbox ------------------------------------------------------------------
    #
    # finish (Complete, Fail) and cancel write a pending message into the outbox in the same
    # atomic step that makes a job with a webhook_url terminal: msg_id "msg_" + 32 hex digits,
    # event from models.WEBHOOK_EVENTS, url the job's webhook_url, next_at = now. Messages go
    # with their job (delete, purge_expired).

    async def add_progress_webhook(self, task_id: str, fence: int, *, now: float) -> bool:
        """Queue a ``task.progress`` message for a running job that has a webhook_url and
        opted in (``webhook_progress``); its body is made when it is first sent, so it tells
        the progress of that moment. Fenced like append_event (LeaseLostError). At most one
        such message waits unsent per job: False (nothing written) while one does, or when
        the job has no webhook or did not opt in."""
        ...

    async def webhook_counts(self) -> dict[str, int]:
        """How many messages are pending, delivered and failed (keys: WebhookStatus values)."""
        ...

    async def failed_webhooks(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[WebhookDelivery], str | None]:
        """Messages that failed for good, most recent failure first, and the cursor of the
        next page (None at the end). A pure read."""
        ...

    async def claim_webhooks(
        self, *, now: float, limit: int, lease_s: float
    ) -> list[WebhookDelivery]:
        """Up to ``limit`` pending messages due by ``now`` (oldest due first), each leased:
        its next_at moves to now+lease_s, so no other dispatcher takes it meanwhile and a
        dispatcher that dies leaves it due again; its ``claim`` grows by one. Atomic."""
        ...

    async def record_webhook_attempt(
        self,
        msg_id: str,
        claim: int,
        attempt: WebhookAttempt,
        *,
        status: WebhookStatus,
        next_at: float | None,
        body: str,
    ) -> bool:
        """Append ``attempt`` to the log and set the status (pending: due again at
        ``next_at``), if the message is still pending under ``claim`` (the number its
        claim_webhooks handed out); else change nothing and return False (a dispatcher whose
        lease ended, or a redelivery, got there first, or the message is gone). Counts the
        try; the first attempt fixes ``body``. A terminal job whose pending message is due
        after its expiry (a receiver's long Retry-After) is kept until outbox.WEBHOOK_KEEP_S past
        that: its message would go with it, never sent and counted nowhere."""
        ...

    async def webhook_deliveries(self, task_id: str) -> list[WebhookDelivery]:
        """The job's webhook messages with their logs, oldest first ([] if it has none).
        JobNotFoundError if the job does not exist."""
        ...

    async def redeliver_webhook(
        self, task_id: str, *, now: float, keep_until: float | None = None
    ) -> WebhookDelivery:
        """Make the job's latest message pending again, due now (same msg_id and body; the
        log is kept; ``claim`` grows, so an attempt in flight is not recorded; ``tries``
        starts again), and keep a terminal job (and so the message) at least until
        ``keep_until``, its new schedule's end. JobNotFoundError if no such job;
        InvalidTransitionError if it has no message yet (no webhook_url, or not terminal and
        no progress message)."""
        ...

    async def expired_leases(self, *, now: float, limit: int) -> list[Job]:
        """Processing jobs whose lease expired before ``now``. A pure read."""
        ...

    async def purge_expired(self, *, now: float, limit: int) -> int:
        """Delete up to ``limit`` terminal jobs whose expires_at <= now, with their events, and
        forget the workers last seen before ``now - WORKER_RETENTION_S``."""
        ...

    async def wake(self, task_id: str, *, now: float) -> bool:
        """Make a queued job that is not due yet due at ``now`` (a parked pipeline whose
        children ended): run_at = now, and it joins its tenant's fair-share line now. False,
        changing nothing, if the job does not exist, is not queued, or is already due. Atomic;
        repeating it is harmless; it wakes ``wait_for_jobs`` like an enqueue."""
        ...

    async def has_open_children(self, parent_id: str) -> bool:
        """Whether the job has a child that is queued or processing. A pure read, O(log n)
        (called after every child's end)."""
        ...

    async def tenant_in_flight(self, tenant: str) -> int:
        """How many of the tenant's jobs are queued or processing (what ``Quota.max_in_flight``
        bounds), not counting children (jobs with a parent_id). A pure read."""
        ...

    async def wait_for_jobs(
        self,
        *,
        now: float,
        timeout: float,
        types: Sequence[str] | None = None,
        worker_id: str | None = None,
        lease_s: float = 30.0,
        on_handed: Callable[[Job], None] | None = None,
    ) -> list[Job]:
        """Return when a job (of ``types``) may have become claimable, or after ``timeout``.

        Returns at once if a queued job is due at ``now``; waits at most until the earliest
        delayed job is due.

        Spurious wake-ups are allowed; a missed one is a bug (it costs pickup latency).

        With ``worker_id`` a backend may hand the waiting worker jobs instead: claimed for it
        (leases of ``lease_s``), passed to ``on_handed`` the moment one arrives during the wait,
        else returned here or by a later call (or by ``stop_waiting``), to be run or released
        like claimed ones. Others return [].
        """
        ...

    async def stop_waiting(self, worker_id: str) -> list[Job]:
        """The worker waits no more: nothing more is handed to it. Returns the jobs handed to
        it that no ``wait_for_jobs`` returned: claimed for it, to be run or released."""
        ...

    async def wait_for_events(self, after: Mapping[str, int], *, timeout: float) -> dict[str, int]:
        """Wait until one of the jobs in ``after`` ({task_id: seq}) has an event past that seq.

        Returns {task_id: latest seq} for those jobs (0 for a job that no longer exists), at
        once if there are any already; {} after ``timeout`` seconds. A pure read: one call
        serves every event stream of a process.
        """
        ...

    async def stats(self, *, now: float, worker_window_s: float = 60.0) -> Stats:
        """Counts by status, queued jobs by priority, DLQ size, workers seen in the window."""
        ...

    # -- concurrency slots -------------------------------------------------------------------
    # A counting semaphore with leases, shared by every process on the store: "at most N
    # concurrent calls to model X". A holder that dies without releasing its slot loses it
    # when its lease ends. A lease is live while expires_at > now. Every call raises
    # InvalidInputError for an empty key or holder, limit < 1 or a lease_s that is not a
    # positive finite number (``check_slot_args``), before it changes anything.

    async def acquire_slot(
        self, key: str, holder: str, *, limit: int, lease_s: float, now: float
    ) -> bool:
        """Take one of ``limit`` slots named ``key`` for ``holder`` until ``now + lease_s``.

        Atomic: drops holders whose lease ended (expires_at <= now) first, then adds ``holder``
        if fewer than ``limit`` remain. Idempotent: a holder that already holds a slot keeps it
        and its lease is extended (to ``now + lease_s``, even when the limit has since been
        lowered below the number of holders). False when all ``limit`` slots are held by
        others. Two acquirers never both get the last slot, across processes too.
        """
        ...

    async def renew_slot(self, key: str, holder: str, *, lease_s: float, now: float) -> bool:
        """Extend ``holder``'s lease to ``now + lease_s``; False if it holds no live slot any more
        (its lease ended, whether or not someone else took the slot since).

        Atomic; repeating it is harmless. A renewal never brings back a lease that ended: the
        holder must acquire again (and may find the slots full).
        """
        ...

    async def release_slot(self, key: str, holder: str) -> None:
        """Give the slot back. Idempotent: releasing a slot not held does nothing."""
        ...

    async def slots_in_use(self, key: str, *, now: float) -> int:
        """How many live (unexpired) holders ``key`` has. A pure read."""
        ...
