"""Hooks on instances, safe metric labels, failed run spans, a caller's trace, kind logging."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest.mock import AsyncMock

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from backburner import Backburner, Hooks, PermanentError
from backburner.builtin import install_builtin_tasks
from backburner.hooks import HookChain
from backburner.models import Job, JobStatus
from backburner.observability.logs import configure_logging
from backburner.observability.tracing import Tracing

from ..helpers import WORKER_TEST_SETTINGS, running_worker
from ..live_server import live_server

JOB = Job(
    task_id="t",
    type="x",
    status=JobStatus.COMPLETED,
    priority=0,
    input={},
    created_at=1.0,
    run_at=1.0,
    attempts=1,
    max_attempts=1,
)


async def test_hooks_set_on_an_instance_or_mocked_are_called() -> None:
    seen: list[str] = []
    plain = Hooks()

    async def mine(job: Job) -> None:
        seen.append(job.task_id)

    plain.on_complete = mine  # type: ignore[method-assign]
    mock = AsyncMock(spec=Hooks)
    chain = HookChain([plain, mock])
    await chain.complete(JOB)
    await chain.start(JOB)
    assert seen == ["t"]
    mock.on_complete.assert_awaited_once_with(JOB)
    mock.on_start.assert_awaited_once_with(JOB)


async def test_a_failed_job_is_not_labelled_with_the_model_its_input_names(
    tmp_path: Path,
) -> None:
    bb = Backburner(
        settings=WORKER_TEST_SETTINGS.replace(backend_url=f"sqlite:///{tmp_path / 'l.db'}")
    )

    @bb.task(max_attempts=1)
    async def picky(ctx: Any, model: str) -> None:
        raise PermanentError("no")

    async with bb, running_worker(bb):
        job = await bb.enqueue("picky", {"model": "anything-a-client-sends"})
        await bb.wait(job.task_id, timeout=30)
    text = bb.metrics.render().decode()
    assert "anything-a-client-sends" not in text
    assert (
        'backburner_task_duration_seconds_count{model="",outcome="failed",type="picky"} 1.0' in text
    )


async def test_a_failed_attempt_marks_its_run_span_as_an_error(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = WORKER_TEST_SETTINGS.replace(backend_url=f"sqlite:///{tmp_path / 's.db'}")
    bb = Backburner(settings=settings, tracing=Tracing(provider))

    @bb.task(max_attempts=1)
    async def boom(ctx: Any) -> None:
        raise PermanentError("it broke")

    async with bb, running_worker(bb):
        job = await bb.enqueue("boom")
        await bb.wait(job.task_id, timeout=30)
    (run,) = [s for s in exporter.get_finished_spans() if s.name == "backburner.run boom"]
    assert run.status.status_code is StatusCode.ERROR
    assert (run.attributes or {})["error.type"] == "PermanentError"


async def test_an_api_request_with_a_traceparent_header_joins_its_trace(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = WORKER_TEST_SETTINGS.replace(backend_url=f"sqlite:///{tmp_path / 'a.db'}")
    bb = Backburner(settings=settings, tracing=Tracing(provider))
    install_builtin_tasks(bb)
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with live_server(tmp_path, backburner=bb, run_worker=False) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answer = await client.post(
                "/v1/generate",
                json={"prompt": "hi", "model": "simulated", "max_tokens": 1},
                headers={"traceparent": caller},
            )
    assert answer.status_code == 202
    (submit,) = [s for s in exporter.get_finished_spans() if s.name.startswith("backburner.submit")]
    assert f"{submit.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert submit.parent is not None and f"{submit.parent.span_id:016x}" == "00f067aa0ba902b7"


def test_configure_logging_leaves_an_applications_own_handlers_alone() -> None:
    root = logging.getLogger()
    theirs = logging.NullHandler()
    root.addHandler(theirs)
    before = list(root.handlers)
    level = root.level
    try:
        configure_logging(logging.DEBUG, json_lines=True)
        assert root.handlers == before and root.level == level
    finally:
        root.removeHandler(theirs)


def test_the_cli_logs_keep_urls_out_and_warnings_in_their_lines() -> None:
    # A fresh process, as the CLI is: httpx's INFO line of each request (a webhook URL's
    # token in it) is not written, and a handler's warnings.warn is one JSON line too.
    script = (
        "import logging, warnings\n"
        "from backburner.observability.logs import configure_logging\n"
        "configure_logging(logging.INFO, json_lines=True)\n"
        "logging.getLogger('httpx').info('HTTP Request: POST https://h.test/?token=SECRET')\n"
        "logging.getLogger('httpx').warning('httpx says: careful')\n"
        "warnings.warn('deprecated thing', DeprecationWarning, stacklevel=1)\n"
        "logging.getLogger('backburner.worker').info('still here')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["message"] for line in lines[:1]] == ["httpx says: careful"]
    assert "deprecated thing" in lines[1]["message"] and lines[1]["logger"] == "py.warnings"
    assert lines[2]["message"] == "still here" and len(lines) == 3
    assert "SECRET" not in done.stderr
