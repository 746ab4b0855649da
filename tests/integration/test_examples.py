"""examples/quickstart.py works as its docstring says: a worker process and a producer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_worker_and_producer(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "backburner", "worker", "examples.quickstart:bb"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "examples.quickstart", "flaky", "report", "about", "leases"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        worker.terminate()
        worker.wait(30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("enqueued task_")
    assert lines[1] == "completed {'summary': 'flaky report about leases'} attempts=2"
    assert worker.returncode == 0  # SIGTERM is a graceful stop
