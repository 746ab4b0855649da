"""Logs: JSON lines with the job's fields off a terminal, readable text on request, no prompts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backburner import Backburner, Settings
from backburner.builtin import install_builtin_tasks
from backburner.observability.logs import JsonFormatter

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "SECRET-PROMPT-4f1c"


def test_a_record_with_job_fields_becomes_one_json_object() -> None:
    record = logging.LogRecord(
        "backburner.worker", logging.INFO, "x.py", 1, "job %s", ("t1",), None
    )
    record.__dict__.update(task_id="t1", type="generate", attempt=2, event="attempt_failed")
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job t1" and line["level"] == "info"
    assert (line["task_id"], line["type"], line["attempt"], line["event"]) == (
        "t1",
        "generate",
        2,
        "attempt_failed",
    )
    assert line["ts"].endswith("Z") and "tenant" not in line


@pytest.mark.timeout(60)
async def test_a_worker_off_a_terminal_logs_json_lines_without_prompts(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'logs.db'}"
    flaky = {"provider": "simulated", "options": {"fail": "server_error", "fail_times": 1}}
    models = json.dumps({"models": {"flaky": flaky}})
    env = {
        **os.environ,
        "BACKBURNER_BACKEND_URL": db,
        "BACKBURNER_MODELS": models,
        "BACKBURNER_RETRY_BASE_S": "0.01",
        "BACKBURNER_RETRY_CAP_S": "0.05",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "backburner", "worker", "--log-level", "info"],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        bb = Backburner(settings=Settings(backend_url=db, models=models))
        install_builtin_tasks(bb)
        async with bb:
            job = await bb.enqueue(
                "generate", {"prompt": PROMPT, "model": "flaky", "max_tokens": 3}
            )
            done = await bb.wait(job.task_id, timeout=30)
        assert done.attempts == 2  # the simulator failed the first call once
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert lines, "the worker logged nothing"
    failed = [line for line in lines if line.get("event") == "attempt_failed"]
    assert failed and failed[0]["task_id"] == job.task_id and failed[0]["attempt"] == 1
    assert any("worker" in line["message"] and "started" in line["message"] for line in lines)
    assert PROMPT not in stderr


def test_text_format_is_chosen_explicitly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backburner", "worker", "--log-format", "yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unknown log format 'yaml'" in done.stderr
