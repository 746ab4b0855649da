"""OpenTelemetry spans for a job's life: submit, queue wait, run, each model call, each webhook.

With ``pip install 'backburner[otel]'``. The submitting span's W3C context is stored with the
job (``traceparent``), so the worker's spans, in another process, join the submitter's trace.
Without the extra every method here does nothing. ``backburner serve|api|worker`` export over
OTLP when the standard ``OTEL_EXPORTER_OTLP_*`` variables name an endpoint
(``configure_from_env``); a library user sets up their own tracer provider.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models import Job, WebhookDelivery

SCOPE = "backburner"


class Tracing:
    """Makes backburner's spans on ``provider`` (None: OpenTelemetry's global provider)."""

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider
        self._explicit = provider is not None
        self._tracer: Any = None
        self._loaded = False
        """OpenTelemetry is imported once spans would go somewhere, not before (its API is
        ~0.5 MB in every process that has the extra but exports nothing)."""

    @property
    def enabled(self) -> bool:
        """True when spans go somewhere: a provider was given, or OpenTelemetry's global one
        was set. Otherwise every span would be dropped, so none is made (a job costs ~10%
        less worker time than making no-op spans)."""
        if not self._loaded:
            if not (self._explicit or _global_provider_set()):
                return False
            self._load()
        return self._tracer is not None

    def _load(self) -> None:
        self._loaded = True
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            return
        self._trace = trace
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=self._provider)
        self._propagator = TraceContextTextMapPropagator()

    def current_traceparent(self) -> str | None:
        """The W3C ``traceparent`` of the current span (None if there is none)."""
        if not self.enabled:
            return None
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get("traceparent")

    def _parent(self, traceparent: str | None) -> Any:
        """The context to start a job's span in: its stored trace, or a new one (never the
        worker's own current span)."""
        if traceparent is None:
            from opentelemetry.context import Context

            return Context()
        return self._propagator.extract({"traceparent": traceparent})

    @contextlib.contextmanager
    def submit(self, task_type: str, caller_traceparent: str | None = None) -> Iterator[Any]:
        """The span of an enqueue (a producer), in the caller's trace if its W3C
        ``traceparent`` is given (an HTTP request's header); yields it, or None."""
        if not self.enabled:
            yield None
            return
        kind = self._trace.SpanKind.PRODUCER
        name = f"backburner.submit {task_type}"
        context = None
        if caller_traceparent is not None:
            context = self._propagator.extract({"traceparent": caller_traceparent})
        with self._tracer.start_as_current_span(name, context=context, kind=kind) as span:
            span.set_attribute("backburner.task.type", task_type)
            yield span

    def queue_wait(self, job: Job) -> None:
        """A span for the time the job waited, from when it was due to its start."""
        if job.started_at is None or not self.enabled:
            return
        due = max(job.created_at, job.run_at)
        span = self._tracer.start_span(
            f"backburner.queue {job.type}",
            context=self._parent(job.traceparent),
            start_time=int(due * 1e9),
            attributes=_job_attributes(job),
        )
        span.end(end_time=int(max(due, job.started_at) * 1e9))

    @contextlib.contextmanager
    def run(self, job: Job) -> Iterator[Any]:
        """The span of one attempt (current while the handler runs); yields it, or None."""
        if not self.enabled:
            yield None
            return
        with self._tracer.start_as_current_span(
            f"backburner.run {job.type}",
            context=self._parent(job.traceparent),
            kind=self._trace.SpanKind.CONSUMER,
            attributes=_job_attributes(job),
        ) as span:
            yield span

    def failed(self, span: Any, error_type: str, message: str) -> None:
        """Mark ``span`` (from ``run``) as an attempt that failed."""
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"[:500]))

    @contextlib.contextmanager
    def llm_call(
        self, task_id: str, provider: str, model: str, max_tokens: int
    ) -> Iterator[dict[str, Any]]:
        """A GenAI client span for one model call; set the usage in the yielded dict."""
        result: dict[str, Any] = {}
        if not self.enabled:
            yield result
            return
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": provider,
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": max_tokens,
            "backburner.task_id": task_id,
        }
        kind = self._trace.SpanKind.CLIENT
        with self._tracer.start_as_current_span(
            f"chat {model}", kind=kind, attributes=attributes
        ) as span:
            try:
                yield result
            finally:
                for key, value in result.items():
                    if value is not None:
                        span.set_attribute(key, value)

    @contextlib.contextmanager
    def webhook(self, message: WebhookDelivery, traceparent: str | None) -> Iterator[Any]:
        """The span of one webhook attempt, in the job's trace; yields it, or None."""
        if not self.enabled:
            yield None
            return
        with self._tracer.start_as_current_span(
            f"backburner.webhook {message.event}",
            context=self._parent(traceparent),
            kind=self._trace.SpanKind.CLIENT,
            attributes={
                "backburner.task_id": message.task_id,
                "backburner.webhook.msg_id": message.msg_id,
                "backburner.webhook.event": message.event,
            },
        ) as span:
            yield span


def _global_provider_set() -> bool:
    """Whether OpenTelemetry's global tracer provider is set (it can be set once). Only code
    that imported opentelemetry.trace can have set it; until then it is None."""
    trace = sys.modules.get("opentelemetry.trace")
    return trace is not None and getattr(trace, "_TRACER_PROVIDER", None) is not None


def _job_attributes(job: Job) -> dict[str, Any]:
    return {
        "backburner.task_id": job.task_id,
        "backburner.task.type": job.type,
        "backburner.attempt": job.attempts,
        "backburner.tenant": job.tenant,
    }


def configure_from_env() -> bool:
    """Export spans over OTLP/HTTP when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set and the
    otel extra is installed (the exporter reads the other OTEL_* variables itself)."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint or os.environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none":
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logging.getLogger("backburner.tracing").warning(
            "%s is set, but no span is exported: the otel extra is not installed"
            " (pip install 'backburner[otel]')",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
            if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            else "OTEL_EXPORTER_OTLP_ENDPOINT",
        )
        return False
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SCOPE)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
