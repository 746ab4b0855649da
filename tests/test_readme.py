"""Every Python example in the README runs, and does what the README says."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, JobStatus

from .helpers import running_worker

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_has_the_examples() -> None:
    assert len(BLOCKS) == 3


def test_quickstart_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(BLOCKS[0])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed {'summary': 'a very long quarterly re'}"
    assert (tmp_path / "backburner.db").exists()


async def test_task_and_enqueue_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    for block in BLOCKS[1:]:
        code = compile(block, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)
        if result is not None:
            await result
    bb: Backburner = namespace["bb"]
    try:
        job = namespace["job"]
        assert job.status == JobStatus.QUEUED and job.priority == 10
        assert job.idempotency_key == "req-42" and job.run_at - job.created_at == 30
        assert job.metadata == {"user": "u1"}
        async with running_worker(bb):
            ok = await bb.enqueue("generate", {"prompt": "say something"})
            empty = await bb.enqueue("generate", {"prompt": "  "})
            done = await bb.wait(ok.task_id, timeout=30)
            failed = await bb.wait(empty.task_id, timeout=30)
        assert done.status == JobStatus.COMPLETED
        assert done.result == {"text": "a short simulated answer"}
        tokens = [e.data["text"] for e in await bb.events(ok.task_id) if e.type == "token"]
        assert " ".join(tokens) == "a short simulated answer"
        assert done.usage is not None and done.usage.output_tokens == 4
        assert failed.status == JobStatus.FAILED and failed.attempts == 1
        assert failed.error is not None and failed.error.message == "empty prompt"
    finally:
        await bb.close()
