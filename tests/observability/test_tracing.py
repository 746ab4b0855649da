"""Traces: submit, queue wait, run, the model call and the webhook, under one trace id."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from backburner import Backburner
from backburner.builtin import install_builtin_tasks
from backburner.observability.tracing import Tracing, configure_from_env
from backburner.webhooks import generate_secret

from ..helpers import WORKER_TEST_SETTINGS, eventually, running_worker
from ..webhooks.receiver import receiver


async def test_one_trace_from_submit_to_webhook(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = WORKER_TEST_SETTINGS.replace(
        backend_url=f"sqlite:///{tmp_path / 't.db'}",
        webhook_secret=generate_secret(),
        webhook_allow_hosts="127.0.0.0/8",
    )
    bb = Backburner(settings=settings, tracing=Tracing(provider))
    install_builtin_tasks(bb)
    with receiver() as hooks:
        async with bb, running_worker(bb):
            job = await bb.enqueue(
                "generate",
                {"prompt": "hi", "model": "simulated", "max_tokens": 3},
                webhook_url=hooks.url("/traced"),
            )
            await asyncio.to_thread(hooks.state.wait_for, "/traced", 1)

            def webhook_span_ended() -> bool:
                return any(
                    s.name.startswith("backburner.webhook") for s in exporter.get_finished_spans()
                )

            await eventually(webhook_span_ended, message="the webhook span")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    names = [
        "backburner.submit generate",
        "backburner.queue generate",
        "backburner.run generate",
        "chat simulated",
        "backburner.webhook task.completed",
    ]
    assert set(names) <= set(spans), sorted(spans)
    trace_ids = {spans[name].context.trace_id for name in names}
    assert len(trace_ids) == 1
    submit, run, chat = spans[names[0]], spans[names[2]], spans["chat simulated"]
    assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert chat.parent is not None and chat.parent.span_id == run.context.span_id
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.request.model"] == "simulated"
    assert chat.attributes["gen_ai.usage.output_tokens"] == 3
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    for name in names:
        attributes = spans[name].attributes or {}
        assert attributes["backburner.task_id"] == job.task_id, name
    assert job.traceparent is not None
    assert job.traceparent.split("-")[1] == f"{submit.context.trace_id:032x}"


def test_without_a_provider_nothing_is_stored_with_the_job() -> None:
    assert Tracing().current_traceparent() is None  # no span is current


def test_an_otlp_endpoint_without_the_otel_extra_says_why_no_span_is_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # It was ignored without a word: an operator saw no trace and no reason.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    # (None in sys.modules: the import fails, as without the extra)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with caplog.at_level(logging.WARNING, logger="backburner.tracing"):
        assert configure_from_env() is False
    (record,) = [r for r in caplog.records if r.name == "backburner.tracing"]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set" in record.getMessage()
    assert "backburner[otel]" in record.getMessage()
