"""``Backburner``: the library's entry point — task registry, settings, backend, policy."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .backends import Backend, Page, backend_from_url
from .backends.base import DEFAULT_TENANT, NewJob, check_tenant, fingerprint, new_task_id
from .clock import Clock, SystemClock
from .errors import (
    ConfigurationError,
    CorruptRecordError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidTransitionError,
    JobNotFoundError,
    UnknownTaskError,
)
from .hooks import HookChain, Hooks
from .jsoncodec import is_unicode, round_trip
from .models import MAX_EVENT_SEQ, Event, Job, JobStatus, WebhookDelivery
from .observability.metrics import Metrics
from .observability.tracing import Tracing
from .pipelines import ParentWaker, cancel_children, pipeline_handler
from .providers.job_llm import LimitSettings
from .providers.routing import ModelRouter
from .settings import Settings
from .tasks import Handler, TaskDefinition
from .tenants import PRIORITY_MAX, PRIORITY_MIN, TenantPolicies
from .webhooks.ssrf import check_url
from .worker.retry import RetryPolicy
from .worker.sweeper import SweepReport, sweep_once

if TYPE_CHECKING:
    from .worker.runner import Worker

H = TypeVar("H", bound=Handler)

MAX_KEY_LENGTH = 255


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_duration(value: object) -> bool:
    if type(value) is float or type(value) is int:  # (the common case: no isinstance of a union)
        return 0 < value < math.inf
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def _positive(name: str, value: float | None, *, allow_none: bool = True) -> None:
    if value is None:
        if not allow_none:
            raise InvalidInputError(f"{name} is required")
        return
    if not _is_duration(value):
        raise InvalidInputError(f"{name} must be a positive number of seconds, got {value!r}")


def _json_object(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(
            f"{name} must be a JSON object (a dict), got {type(value).__name__}"
        )
    copied: dict[str, Any] = round_trip(value, name)
    return copied


class Backburner:
    """Register tasks, enqueue jobs, read and cancel them, and run workers.

    >>> bb = Backburner("sqlite:///backburner.db")
    """

    def __init__(
        self,
        backend: str | Backend | None = None,
        *,
        settings: Settings | None = None,
        hooks: Sequence[Hooks] = (),
        clock: Clock | None = None,
        models: ModelRouter | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.tracing = tracing or Tracing()
        """OpenTelemetry spans (with ``backburner[otel]``; otherwise they cost nothing)."""
        self.models = models or ModelRouter.from_source(self.settings.models)
        """Model routes for ``ctx.llm`` and the built-in ``generate`` task."""
        if self.settings.default_model is not None:
            self.models.set_default(self.settings.default_model)
        self.model_limits = LimitSettings(
            lease_s=self.settings.lease_s, renew_s=self.settings.heartbeat_s
        )
        if backend is None or isinstance(backend, str):
            url = backend or self.settings.backend_url
            self.backend: Backend = backend_from_url(
                url, max_queue_size=self.settings.max_queue_size
            )
        else:
            self.backend = backend
        self.metrics = Metrics()
        """Prometheus metrics of this process (``GET /metrics``; docs/metrics.md)."""
        self.hooks = HookChain(
            [self.metrics.hook(lambda: self.clock.now()), ParentWaker(self), *hooks]
        )
        self.clock: Clock = clock or SystemClock()
        self.tenants = TenantPolicies.from_source(self.settings.tenants)
        """Each tenant's limits and fair-share weight (the ``tenants`` setting)."""
        self.priority_classes = self.settings.priority_class_map()
        for name, value in self.priority_classes.items():
            self._check_priority(value, ConfigurationError, f"priority class {name!r}")
        self.retry_policy = RetryPolicy(
            base_s=self.settings.retry_base_s,
            cap_s=self.settings.retry_cap_s,
            dead_letter_ttl_s=self.settings.dead_letter_ttl_s,
        )
        self.tasks: dict[str, TaskDefinition] = {}
        self._workers: set[Worker] = set()
        """Workers running in this process, told directly about cancellations."""
        self._connected = False
        self._connect_lock: asyncio.Lock | None = None

    # -- registry ----------------------------------------------------------------------------

    @overload
    def task(self, name: H, /) -> H: ...

    @overload
    def task(
        self,
        name: str | None = None,
        *,
        max_attempts: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        ttl: float | None = None,
        priority: int = 0,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        permanent_on: tuple[type[BaseException], ...] = (),
        validate: Callable[[dict[str, Any]], None] | None = None,
    ) -> Callable[[H], H]: ...

    def task(
        self,
        name: str | Handler | None = None,
        *,
        max_attempts: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        ttl: float | None = None,
        priority: int = 0,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        permanent_on: tuple[type[BaseException], ...] = (),
        validate: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        """Register an async handler ``fn(ctx, **input)`` as a task (usable bare or called).

        ``timeout`` bounds each attempt, ``deadline`` the whole job from enqueue; exceptions
        in ``permanent_on`` (and ``PermanentError``) fail at once, others in ``retry_on`` retry.
        ``validate(input)`` checks the values of an input (raise InvalidInputError): at
        submission, so a bad one is refused (a 422) with nothing stored, and before each run.
        """
        if callable(name):
            return self.task()(name)

        def decorator(fn: H) -> H:
            task_name = name if isinstance(name, str) else fn.__name__
            if max_attempts is not None and not _is_count(max_attempts):
                raise ConfigurationError("max_attempts must be an integer >= 1")
            for label, value in (("timeout", timeout), ("deadline", deadline), ("ttl", ttl)):
                if value is not None and not _is_duration(value):
                    raise ConfigurationError(f"{label} must be a positive number of seconds")
            self._check_priority(priority, ConfigurationError)
            definition = TaskDefinition(
                name=task_name,
                handler=fn,
                max_attempts=max_attempts,
                timeout_s=timeout,
                deadline_s=deadline,
                ttl_s=ttl,
                priority=priority,
                retry_on=retry_on,
                permanent_on=permanent_on,
                validate=validate,
            )
            self.register(definition)
            with contextlib.suppress(AttributeError):  # ctx.map(name, fn, ...) finds it by this
                fn.__backburner_task__ = task_name  # type: ignore[attr-defined]
            return fn

        return decorator

    def pipeline(self, name: str | Handler | None = None, **options: Any) -> Any:
        """Register ``fn(ctx, **input)`` as a durable pipeline (usable bare or called, with the
        options of ``task``): ``ctx.step`` stores each step's result, ``ctx.map`` and
        ``ctx.spawn`` run child jobs while the pipeline waits without a worker slot; after a
        crash it runs again from the top and completed steps are not repeated
        (docs/pipelines.md)."""
        if callable(name):
            return self.pipeline()(name)

        def decorator(fn: H) -> H:
            task_name = name if isinstance(name, str) else fn.__name__
            self.task(task_name, **options)(pipeline_handler(self, fn))
            with contextlib.suppress(AttributeError):
                fn.__backburner_task__ = task_name  # type: ignore[attr-defined]
            return fn

        return decorator

    def register(self, definition: TaskDefinition) -> None:
        if definition.name in self.tasks:
            raise ConfigurationError(f"a task named {definition.name!r} is already registered")
        self.tasks[definition.name] = definition

    # -- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the backend (done on first use; call it to fail early)."""
        if self._connected:
            return
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if not self._connected:
                await self.backend.connect()
                self._connected = True

    async def close(self) -> None:
        await self.models.aclose()
        if self._connected:
            self._connected = False
            await self.backend.close()

    async def __aenter__(self) -> Backburner:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- producers ---------------------------------------------------------------------------

    @staticmethod
    def _check_priority(
        priority: object, error: type[Exception] = InvalidInputError, what: str = "priority"
    ) -> int:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise error(f"{what} must be an integer, got {priority!r}")
        if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise error(
                f"{what} must be within {PRIORITY_MIN}..{PRIORITY_MAX} (higher runs first),"
                f" got {priority}"
            )
        return priority

    def priority_of(self, priority: int | str) -> int:
        """A priority given as a number or by the name of a class (``interactive``, ``batch``)."""
        if isinstance(priority, str):
            if priority not in self.priority_classes:
                known = ", ".join(f"{k}={v}" for k, v in self.priority_classes.items())
                raise InvalidInputError(f"unknown priority class {priority!r} (known: {known})")
            return self.priority_classes[priority]
        return self._check_priority(priority)

    def build_job(
        self,
        task: str,
        input: dict[str, Any] | None = None,
        *,
        priority: int | str | None = None,
        idempotency_key: str | None = None,
        ttl: float | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        delay: float | None = None,
        run_at: float | datetime | None = None,
        metadata: dict[str, Any] | None = None,
        webhook_url: str | None = None,
        webhook_progress: bool = False,
        request_fingerprint: str | None = None,
        traceparent: str | None = None,
        tenant: str = DEFAULT_TENANT,
        parent_id: str | None = None,
    ) -> NewJob:
        """Validate an enqueue request and return what would be stored (stores nothing).

        ``request_fingerprint`` replaces the default (task and input) as what an idempotency
        key must match: the HTTP API passes a digest of the whole request body. Idempotency
        keys are per tenant: another tenant's use of the same key is a different job.
        """
        definition = self.tasks.get(task) if isinstance(task, str) else None
        if definition is None:
            known = ", ".join(sorted(self.tasks)) or "none registered"
            raise UnknownTaskError(f"unknown task {task!r} (known: {known})")
        payload = _json_object("input", input)
        definition.check_input(payload)
        meta = _json_object("metadata", metadata)
        asked = priority is not None
        priority = self.priority_of(definition.priority if priority is None else priority)
        check_tenant(tenant)
        # A child is lowered to the cap, never refused: its pipeline was admitted, and a cap
        # lowered while it runs must not fail its next map.
        priority = self.tenants.check_priority(tenant, priority, asked=asked and parent_id is None)
        ttl_s = ttl if ttl is not None else (definition.ttl_s or self.settings.default_ttl_s)
        _positive("ttl", ttl_s, allow_none=False)
        if max_attempts is not None and not _is_count(max_attempts):
            raise InvalidInputError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        attempts = max_attempts or definition.max_attempts or self.settings.default_max_attempts
        timeout_s = timeout if timeout is not None else definition.timeout_s
        if timeout_s is None:
            timeout_s = self.settings.default_timeout_s
        _positive("timeout", timeout_s)
        deadline_s = deadline if deadline is not None else definition.deadline_s
        _positive("deadline", deadline_s)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str)
            or not 0 < len(idempotency_key) <= MAX_KEY_LENGTH
            or not is_unicode(idempotency_key)
        ):
            raise InvalidInputError(
                f"idempotency_key must be a string of 1..{MAX_KEY_LENGTH} characters"
                " (Unicode: no lone UTF-16 surrogate)"
            )
        if webhook_url is not None:
            if (
                not isinstance(webhook_url, str)
                or not webhook_url.startswith(("http://", "https://"))
                or not is_unicode(webhook_url)
            ):
                raise InvalidInputError("webhook_url must be an http:// or https:// URL (Unicode)")
            # Checked again, with DNS, when each delivery connects (ssrf.resolve_safe).
            check_url(webhook_url, allow=self.settings.allowed_webhook_hosts())
        if not isinstance(webhook_progress, bool):
            raise InvalidInputError("webhook_progress must be true or false")
        if webhook_progress and webhook_url is None:
            raise InvalidInputError("webhook_progress needs a webhook_url")
        if webhook_url is not None:
            # The job (and with it its webhook messages) stays until the last retry is due.
            ttl_s = max(ttl_s, self.settings.webhook_retention_s())
        now = self.clock.now()
        due = now
        if delay is not None and run_at is not None:
            raise InvalidInputError("give delay or run_at, not both")
        if delay is not None:
            if not _is_number(delay) or not math.isfinite(delay) or delay < 0:
                raise InvalidInputError(f"delay must be a number of seconds >= 0, got {delay!r}")
            due = now + delay
        elif run_at is not None:
            due = run_at.timestamp() if isinstance(run_at, datetime) else run_at
            if not _is_number(due) or not math.isfinite(due):
                raise InvalidInputError("run_at must be a datetime or a Unix time")
            due = max(float(due), now)
        return NewJob(
            task_id=new_task_id(),
            type=task,
            input=payload,
            # Only an idempotency key is ever checked against it: no key, no digest to pay for.
            fingerprint=request_fingerprint
            or (fingerprint(task, payload) if idempotency_key is not None else ""),
            created_at=now,
            run_at=due,
            priority=priority,
            max_attempts=attempts,
            timeout_s=timeout_s,
            deadline_at=None if deadline_s is None else now + deadline_s,
            ttl_s=float(ttl_s),
            idempotency_key=(
                idempotency_key
                if idempotency_key is None or tenant == DEFAULT_TENANT
                else f"{tenant}/{idempotency_key}"
            ),
            metadata=meta,
            webhook_url=webhook_url,
            webhook_progress=webhook_progress,
            traceparent=traceparent,
            tenant=tenant,
            fair_cost=self.tenants.policy(tenant).fair_cost,
            parent_id=parent_id,
        )

    async def enqueue(self, task: str, input: dict[str, Any] | None = None, **options: Any) -> Job:
        """Validate and store a job; return it (status ``queued``).

        Options: priority (a number, or a class name such as ``interactive``), idempotency_key,
        ttl, max_attempts, timeout, deadline, delay, run_at, metadata, webhook_url,
        webhook_progress, tenant (whose quota and fair share the job counts in). Raises a
        ``backburner.errors`` exception on bad input (nothing stored),
        IdempotencyConflictError, QueueFullError, QuotaExceededError, SubmitRateLimitedError
        or BackendError.
        """
        job, _ = await self.submit(task, input, **options)
        return job

    async def submit(
        self,
        task: str,
        input: dict[str, Any] | None = None,
        *,
        caller_traceparent: str | None = None,
        limits: bool = True,
        **options: Any,
    ) -> tuple[Job, bool]:
        """Like enqueue, and also say whether the job is new (False: an idempotent repeat).

        ``caller_traceparent``: the W3C trace context of the request that asked for the job
        (the API passes its ``traceparent`` header), for the job's spans to join. ``limits``
        False skips the tenant's quota (a pipeline's children: the pipeline was admitted)."""
        if not self.tracing.enabled:  # no span to make: not even a no-op context's cost
            new = self.build_job(task, input, traceparent=None, **options)
            return await self._store(new, limits)
        with self.tracing.submit(task, caller_traceparent) as span:
            traceparent = self.tracing.current_traceparent()
            job, created = await self._store(
                self.build_job(task, input, traceparent=traceparent, **options), limits
            )
            if span is not None:
                span.set_attribute("backburner.task_id", job.task_id)
                span.set_attribute("backburner.tenant", job.tenant)
            return job, created

    async def _store(self, new: NewJob, limits: bool) -> tuple[Job, bool]:
        if not self._connected:
            await self.connect()
        quota = self.tenants.policy(new.tenant).quota() if limits else None
        try:
            job, created = await self.backend.enqueue(new, quota=quota)
        except IdempotencyConflictError as exc:
            # The key as the caller gave it, not as stored (build_job prefixes a tenant's).
            prefix = f"{new.tenant}/"
            if new.tenant == DEFAULT_TENANT or not exc.key.startswith(prefix):
                raise
            raise IdempotencyConflictError(exc.key.removeprefix(prefix), exc.task_id) from None
        if created:
            await self.hooks.enqueue(job)
        return job, created

    # -- readers -----------------------------------------------------------------------------
    #
    # Every call about one job takes ``tenant``: given, a job of another tenant is answered
    # exactly like a missing one (JobNotFoundError); None (library code, admins) sees all.

    async def get(self, task_id: str, *, tenant: str | None = None) -> Job:
        """The job; JobNotFoundError if it does not exist, expired or is another tenant's."""
        await self.connect()
        job = await self.backend.get(task_id)
        if job is None or (tenant is not None and job.tenant != tenant):
            raise JobNotFoundError(task_id)
        return job

    async def events(
        self, task_id: str, *, after: int = 0, limit: int = 1000, tenant: str | None = None
    ) -> list[Event]:
        """The job's events with seq > ``after``, oldest first. JobNotFoundError if no job."""
        if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= MAX_EVENT_SEQ:
            raise InvalidInputError(f"after must be an integer within 0..{MAX_EVENT_SEQ}")
        if not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidInputError("limit must be within 1..10000")
        await self.connect()
        if tenant is not None:
            await self.get(task_id, tenant=tenant)
        events = await self.backend.events(task_id, after=after, limit=limit)
        if not events and await self.backend.get(task_id) is None:
            raise JobNotFoundError(task_id)
        return events

    async def list(
        self,
        *,
        status: JobStatus | str | None = None,
        type: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
        parent_id: str | None = None,
    ) -> Page:
        """Jobs newest first (``tenant``'s only, or ``parent_id``'s children, if given); pass
        ``page.next_cursor`` for the next page."""
        if status is not None:
            try:
                status = JobStatus(status)
            except ValueError:
                raise InvalidInputError(f"unknown status {status!r}") from None
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidInputError("limit must be within 1..1000")
        await self.connect()
        return await self.backend.list_jobs(
            status=status, type=type, tenant=tenant, parent_id=parent_id, limit=limit, cursor=cursor
        )

    async def dead_letters(
        self, *, limit: int = 50, cursor: str | None = None, tenant: str | None = None
    ) -> Page:
        """The dead-letter queue: failed jobs, newest first, each with its attempt history."""
        return await self.list(status=JobStatus.FAILED, limit=limit, cursor=cursor, tenant=tenant)

    async def in_flight(self, tenant: str = DEFAULT_TENANT) -> int:
        """How many of the tenant's jobs are queued or processing (what its quota bounds)."""
        await self.connect()
        return await self.backend.tenant_in_flight(check_tenant(tenant))

    async def wait(self, task_id: str, *, timeout: float | None = None) -> Job:
        """Poll until the job is terminal; TimeoutError after ``timeout`` seconds."""
        delay = 0.01
        async with asyncio.timeout(timeout):
            while True:
                job = await self.get(task_id)
                if job.is_terminal:
                    return job
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    # -- control -----------------------------------------------------------------------------

    async def cancel(self, task_id: str, *, tenant: str | None = None) -> Job:
        """Cancel a job now: queued ones never run; running ones are stopped within a second.

        Idempotent: cancelling a terminal job returns it unchanged.
        """
        await self.connect()
        before = await self.backend.get(task_id)
        if before is None or (tenant is not None and before.tenant != tenant):
            raise JobNotFoundError(task_id)
        job, changed = await self.backend.cancel(task_id, now=self.clock.now())
        if changed:
            if before.status == JobStatus.PROCESSING:
                for worker in self._workers:  # a worker in this process can stop it at once
                    worker.cancel_local(task_id, before.fence)
            await self.hooks.cancel(job)
        if job.status == JobStatus.CANCELLED:
            await cancel_children(self, task_id)  # a pipeline's children go with it
        return job

    async def webhooks(
        self, task_id: str, *, tenant: str | None = None
    ) -> builtins.list[WebhookDelivery]:
        """The job's webhook messages and every delivery attempt. JobNotFoundError if none."""
        await self.connect()
        if tenant is not None:
            await self.get(task_id, tenant=tenant)
        return await self.backend.webhook_deliveries(task_id)

    async def redeliver_webhook(
        self, task_id: str, *, tenant: str | None = None
    ) -> WebhookDelivery:
        """Send the job's webhook again (same webhook-id and body), now.

        InvalidTransitionError if the job has none (no webhook_url, or not finished)."""
        await self.connect()
        if tenant is not None:
            await self.get(task_id, tenant=tenant)
        now = self.clock.now()  # (the schedule starts again: the job stays until its end)
        keep_until = now + self.settings.webhook_retention_s()
        message = await self.backend.redeliver_webhook(task_id, now=now, keep_until=keep_until)
        self.poke_webhooks()
        return message

    def poke_webhooks(self) -> None:
        """A webhook message is due now: the dispatchers of this process's workers look."""
        for worker in self._workers:
            worker.dispatcher.poke()

    async def replay(
        self, task_id: str, *, max_attempts: int | None = None, tenant: str | None = None
    ) -> Job:
        """Re-queue a dead-lettered (failed) job with a fresh attempt budget; keeps history."""
        await self.connect()
        if max_attempts is not None and not _is_count(max_attempts):
            raise InvalidInputError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        job = await self.get(task_id, tenant=tenant)
        if job.parent_id is not None:
            parent = await self.backend.job_status(job.parent_id)
            if parent is None or parent.is_terminal:
                # (Its start would cancel it: a child of an ended pipeline or batch never runs.)
                ended = "is gone" if parent is None else f"is {parent.value}"
                hint = (
                    " (replay that one: it runs its failed children again)"
                    if parent is JobStatus.FAILED
                    else ""
                )
                raise InvalidTransitionError(
                    f"job {task_id} is a child of {job.parent_id}, which {ended}: it cannot"
                    f" run again on its own{hint}"
                )
        return await self.backend.replay(
            task_id,
            now=self.clock.now(),
            extra_attempts=max_attempts or self.replay_budget(job.type),
            quota=self.tenants.policy(job.tenant).quota(),
        )

    def replay_budget(self, task: str) -> int:
        """The attempts a replay of a job of ``task`` adds when none are asked for: its task's
        max_attempts, else the default."""
        definition = self.tasks.get(task)
        budget = definition.max_attempts if definition else None
        return budget or self.settings.default_max_attempts

    async def delete(self, task_id: str, *, tenant: str | None = None) -> None:
        """Delete a terminal job and its events now. JobNotFoundError if missing;
        InvalidTransitionError if it is running, or a child of a pipeline or batch that is."""
        await self.connect()
        try:
            job: Job | None = await self.get(task_id, tenant=tenant)
        except CorruptRecordError:
            if tenant is not None:  # (whose it is cannot be read: only an admin may)
                raise
            job = None
        if job is not None and job.parent_id is not None and job.is_terminal:
            parent = await self.backend.job_status(job.parent_id)
            if parent is not None and not parent.is_terminal:
                # Its parent reads its children's results when they have all ended.
                raise InvalidTransitionError(
                    f"job {task_id} is a child of {job.parent_id}, which is {parent.value}:"
                    " delete it once that has ended (or cancel that first)"
                )
        if not await self.backend.delete(task_id):
            raise JobNotFoundError(task_id)

    async def sweep(self) -> SweepReport:
        """Run one sweeper pass now (workers do this every ``sweep_interval_s``)."""
        await self.connect()
        return await sweep_once(self)

    # -- workers -----------------------------------------------------------------------------

    def attach_worker(self, worker: Worker) -> None:
        """Called by a worker of this app when it starts (so cancel() can reach it at once)."""
        self._workers.add(worker)

    def detach_worker(self, worker: Worker) -> None:
        self._workers.discard(worker)

    def worker(self, *, concurrency: int | None = None, worker_id: str | None = None) -> Worker:
        from .worker.runner import Worker

        return Worker(self, concurrency=concurrency, worker_id=worker_id)

    async def run_worker(
        self, *, concurrency: int | None = None, handle_signals: bool = True
    ) -> None:
        """Run a worker in this process until SIGTERM/SIGINT (graceful; twice: at once)."""
        await self.worker(concurrency=concurrency).run(handle_signals=handle_signals)
