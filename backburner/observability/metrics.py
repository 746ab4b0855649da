"""Prometheus metrics: counters and histograms fed by lifecycle hooks, gauges read from the
backend when scraped. One registry per ``Metrics`` (no global state); names in docs/metrics.md.

Each process exports what it saw: an API process its submissions and cancels, a worker its
runs, retries, failures and webhook deliveries. The gauges (queue depth, jobs in flight, DLQ
size, workers, webhook messages) describe the whole deployment and read the same from any
process; aggregate the counters with ``sum()`` and the gauges with ``max()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..hooks import Hooks
from ..models import ErrorInfo, Job, JobStatus, continues_attempt
from .series import CounterFamily, Families, GaugeFamily, HistogramFamily

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..backends.base import Backend

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


def model_of(job: Job) -> str:
    """The model a job used, as its usage says (a routed model's name), or "". Never what
    the input asked for: a client could make any number of series."""
    if job.usage is not None and job.usage.model_extra:
        model = job.usage.model_extra.get("model")
        if isinstance(model, str):
            return model
    return ""


class Metrics:
    """Every metric backburner exports, on its own registry."""

    def __init__(self) -> None:
        self._registry: CollectorRegistry | None = None
        families = self._families = Families()

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> CounterFamily:
            return families.add(CounterFamily(name, doc, labels))

        def histogram(
            name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
        ) -> HistogramFamily:
            return families.add(HistogramFamily(name, doc, labels, buckets=buckets))

        self.submitted = counter("backburner_tasks_submitted_total", "Jobs enqueued.", ("type",))
        self.started = counter("backburner_tasks_started_total", "Attempts started.", ("type",))
        self.completed = counter(
            "backburner_tasks_completed_total", "Jobs completed.", ("type", "model")
        )
        self.failed = counter(
            "backburner_tasks_failed_total",
            "Jobs failed for good (into the dead-letter queue), by error type.",
            ("type", "error_type"),
        )
        self.retries = counter(
            "backburner_task_retries_total",
            "Attempts that failed and will retry.",
            ("type", "error_type"),
        )
        self.cancelled = counter("backburner_tasks_cancelled_total", "Jobs cancelled.", ("type",))
        self.duration = histogram(
            "backburner_task_duration_seconds",
            "Run time of the attempt that ended the job (start to end).",
            ("type", "model", "outcome"),
            DURATION_BUCKETS,
        )
        self.queue_latency = histogram(
            "backburner_task_queue_latency_seconds",
            "From when a job was due (enqueued, or its delay over) to the start of its attempt.",
            ("type",),
            LATENCY_BUCKETS,
        )
        self.input_tokens = counter(
            "backburner_llm_input_tokens_total", "Prompt tokens of completed jobs.", ("model",)
        )
        self.output_tokens = counter(
            "backburner_llm_output_tokens_total", "Generated tokens of completed jobs.", ("model",)
        )
        self.cost = counter(
            "backburner_llm_cost_usd_total", "Cost of completed jobs (priced models).", ("model",)
        )
        self.first_token = histogram(
            "backburner_llm_time_to_first_token_seconds",
            "Time to the first token of a job's last model call.",
            ("model",),
            TTFT_BUCKETS,
        )
        self.webhook_deliveries = counter(
            "backburner_webhook_deliveries_total",
            "Webhook attempts by outcome: delivered, retry (it will be tried again), failed.",
            ("outcome",),
        )
        for outcome in ("delivered", "retry", "failed"):  # so rate() sees the first one
            self.webhook_deliveries.labels(outcome)
        self.webhook_latency = histogram(
            "backburner_webhook_delivery_seconds",
            "Duration of one webhook attempt.",
            (),
            LATENCY_BUCKETS,
        )

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeFamily:
            return families.add(GaugeFamily(name, doc, labels))

        self.jobs = gauge("backburner_jobs", "Stored jobs by status.", ("status",))
        self.queue_depth = gauge(
            "backburner_queue_depth", "Queued jobs by priority.", ("priority",)
        )
        self.in_flight = gauge("backburner_jobs_in_flight", "Jobs queued or processing.")
        self.due = gauge(
            "backburner_jobs_due",
            "Queued jobs whose time has come (not waiting for a delay, a retry's backoff or a"
            " parked pipeline's next look): with the processing ones, the work a worker could"
            " do now.",
        )
        self.dead_letter = gauge(
            "backburner_dead_letter_jobs", "Failed jobs waiting in the dead-letter queue."
        )
        self.workers = gauge(
            "backburner_active_workers", "Worker processes seen in the last minute."
        )
        self.webhook_messages = gauge(
            "backburner_webhook_messages", "Webhook messages by status.", ("status",)
        )
        self.backend_up = gauge(
            "backburner_backend_up",
            "1 if this process's last look at the backend (for the gauges above) worked; 0 if"
            " it failed, and those gauges still hold what it saw before.",
        )
        self.refreshed = gauge(
            "backburner_gauges_refreshed_timestamp_seconds",
            "When the backend's gauges were last read (Unix time): how old they are.",
        )
        self.families = families.families
        """Every metric above, in the order they are exported."""

    @property
    def registry(self) -> CollectorRegistry:
        """The prometheus_client registry that exports these metrics, made on first use (a
        process nobody scrapes never imports prometheus_client)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry()
            self._families.register(registry)
            self._registry = registry
        return self._registry

    def hook(self, now: Callable[[], float] = time.time) -> Hooks:
        """The lifecycle hook that feeds the counters and histograms; ``now``: the clock of
        the process it runs in (a job starts by it)."""
        return _MetricsHook(self, now)

    async def refresh(self, backend: Backend, *, now: float) -> None:
        """Set the deployment-wide gauges from the backend; if that fails, mark them stale
        (``backburner_backend_up`` 0) and raise."""
        try:
            await self._read_backend(backend, now=now)
        except Exception:  # (a cancelled refresh says nothing of the backend)
            self.backend_up.set(0)
            raise
        self.backend_up.set(1)
        self.refreshed.set(time.time())

    async def _read_backend(self, backend: Backend, *, now: float) -> None:
        stats = await backend.stats(now=now)
        for status in JobStatus:
            self.jobs.labels(status.value).set(stats.counts.get(status, 0))
        self.queue_depth.clear()
        # Priority 0, the default, always has a series: an empty queue reads 0, not "no data".
        for priority, n in {0: 0, **stats.queued_by_priority}.items():
            self.queue_depth.labels(str(priority)).set(n)
        self.in_flight.set(
            stats.counts.get(JobStatus.QUEUED, 0) + stats.counts.get(JobStatus.PROCESSING, 0)
        )
        self.due.set(stats.due)
        self.dead_letter.set(stats.dead_letter)
        self.workers.set(len(stats.workers))
        for state, n in (await backend.webhook_counts()).items():
            self.webhook_messages.labels(state).set(n)

    def render(self) -> bytes:
        """The text exposition of every metric."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _MetricsHook(Hooks):
    def __init__(self, m: Metrics, now: Callable[[], float]) -> None:
        self.m = m
        self.now = now

    async def on_enqueue(self, job: Job) -> None:
        self.m.submitted.labels(job.type).inc()

    async def on_start(self, job: Job) -> None:
        history = job.history
        if continues_attempt(history):
            return  # a pipeline woken after waiting for its children: the same attempt
        self.m.started.labels(job.type).inc()
        if job.started_at is not None:
            # Now, not started_at: a job handed to an idle worker (Redis) is written claimed
            # by the enqueue, started at its creation, however late the worker hears of it.
            due = max(job.created_at, job.run_at)
            self.m.queue_latency.labels(job.type).observe(max(0.0, self.now() - due))

    async def on_retry(self, job: Job, error: ErrorInfo) -> None:
        self.m.retries.labels(job.type, error.type).inc()

    async def on_complete(self, job: Job) -> None:
        model = model_of(job)
        self.m.completed.labels(job.type, model).inc()
        self._duration(job, model, "completed")
        usage = job.usage
        if usage is None:
            return
        if model or usage.input_tokens or usage.output_tokens:
            self.m.input_tokens.labels(model).inc(usage.input_tokens)
            self.m.output_tokens.labels(model).inc(usage.output_tokens)
        extra = usage.model_extra or {}
        cost = extra.get("cost_usd")
        if isinstance(cost, int | float) and cost > 0:
            self.m.cost.labels(model).inc(cost)
        ttft = extra.get("time_to_first_token_s")
        if isinstance(ttft, int | float):
            self.m.first_token.labels(model).observe(ttft)

    async def on_fail(self, job: Job) -> None:
        error_type = job.error.type if job.error is not None else "unknown"
        self.m.failed.labels(job.type, error_type).inc()
        self._duration(job, model_of(job), "failed")

    async def on_cancel(self, job: Job) -> None:
        self.m.cancelled.labels(job.type).inc()

    def _duration(self, job: Job, model: str, outcome: str) -> None:
        if job.finished_at is None or not job.history:
            return
        # From the attempt's first run: a pipeline's attempt spans its waits for children.
        history = job.history
        first = len(history) - 1
        while first > 0 and history[first - 1].outcome == "waiting":
            first -= 1
        started = history[first].started_at
        self.m.duration.labels(job.type, model, outcome).observe(
            max(0.0, job.finished_at - started)
        )
