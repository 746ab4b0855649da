"""The command line, run as a real process: help, demo, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path = ROOT, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backburner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error:"), done.stderr
    assert needle in " ".join(done.stderr.split()), done.stderr


def test_help_lists_the_commands() -> None:
    done = run("--help")
    assert done.returncode == 0
    for command in ("demo", "worker", "enqueue", "status", "cancel", "tasks", "dlq"):
        assert command in done.stdout


def test_demo_runs_to_the_end_on_sqlite(tmp_path: Path) -> None:
    done = run("demo", "--jobs", "2", "--backend", f"sqlite:///{tmp_path}/demo.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 job(s) in the dead-letter queue" in done.stdout
    listing = run("tasks", "--backend", f"sqlite:///{tmp_path}/demo.db", "--limit", "10")
    assert listing.returncode == 0
    assert listing.stdout.count("completed") == 3
    assert listing.stdout.count("failed") == 1


def test_enqueue_status_cancel_and_dlq_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    enq = run(
        "enqueue",
        "tests.workerapp:bb",
        "sleepy",
        "-i",
        '{"seconds": 1}',
        "--delay",
        "60",
        "--backend",
        url,
    )
    assert enq.returncode == 0, enq.stderr
    job = json.loads(enq.stdout)
    assert job["status"] == "queued" and job["type"] == "sleepy"
    status = run("status", job["task_id"], "--backend", url)
    assert json.loads(status.stdout)["task_id"] == job["task_id"]
    cancelled = run("cancel", job["task_id"], "--backend", url)
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    replay = run("dlq", "replay", job["task_id"], "--backend", url)
    assert_one_line_error(replay, "only failed jobs can be replayed")


def test_errors_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(
        run("status", "task_missing", "--backend", f"sqlite:///{tmp_path}/x.db"), "no job"
    )
    assert_one_line_error(run("tasks", "--backend", "bogus://x"), "unknown backend URL")
    assert_one_line_error(
        run("tasks", "--backend", "sqlite:////nonexistent-dir/x.db"), "does not exist"
    )
    assert_one_line_error(run("worker", "no_such_module:bb"), "cannot import")
    assert_one_line_error(run("worker", "tests.workerapp:missing"), "not a Backburner")
    assert_one_line_error(
        run("enqueue", "tests.workerapp:bb", "nope", "--backend", f"sqlite:///{tmp_path}/x.db"),
        "unknown task 'nope'",
    )
    assert_one_line_error(
        run(
            "enqueue",
            "tests.workerapp:bb",
            "sleepy",
            "-i",
            "{not json",
            "--backend",
            f"sqlite:///{tmp_path}/x.db",
        ),
        "not valid JSON",
    )
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    assert_one_line_error(run("tasks", "--backend", f"sqlite:///{corrupt}"), "cannot open")
