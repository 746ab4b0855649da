"""``backburner batch`` as a real process against a real server: submit a JSONL file with a
progress bar, status, results, cancel, and one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ..helpers import ROOT
from ..unit.test_cli import assert_one_line_error
from .conftest import batch_server


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backburner", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    return path


async def test_submit_wait_status_results_and_cancel(tmp_path: Path) -> None:
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl",
        [
            *({"custom_id": f"p{i}", "prompt": f"prompt {i}", "max_tokens": 3} for i in range(300)),
            {"prompt": "no id", "max_tokens": 3},  # line 301
            "a bare prompt",  # line 302
            {"custom_id": "doomed", "prompt": "x", "max_tokens": 3, "model": "broken"},
        ],
    )
    async with batch_server("live", tmp_path, default_model="broken") as server:
        url = str(server.client.base_url)
        # A real terminal for rich, so the progress bar is drawn (on stderr).
        waited = await asyncio.to_thread(
            run,
            "batch",
            "submit",
            str(prompts),
            "--model",
            "fast",
            "--wait",
            "--url",
            url,
            env={"TTY_COMPATIBLE": "1"},
        )
        assert waited.returncode == 0, waited.stderr
        batch = json.loads(re.sub(r"\x1b\[[0-9;]*m", "", waited.stdout))  # rich's colours
        assert batch["status"] == "completed"
        counts = batch["request_counts"]
        assert (counts["total"], counts["completed"], counts["failed"]) == (303, 302, 1)
        assert re.search(r"\b\d+/303\b", waited.stderr), waited.stderr
        batch_id = batch["batch_id"]

        shown = await asyncio.to_thread(run, "batch", "status", batch_id, "--url", url)
        assert json.loads(shown.stdout)["request_counts"] == counts

        printed = await asyncio.to_thread(run, "batch", "results", batch_id, "--url", url)
        rows = [json.loads(line) for line in printed.stdout.splitlines()]
        assert len(rows) == 303
        by_id = {row["custom_id"]: row for row in rows}
        assert by_id["301"]["status"] == by_id["302"]["status"] == "completed"
        assert by_id["302"]["result"]["model"] == "fast"
        assert by_id["doomed"]["error"]["type"] == "context_length_exceeded"

        out = tmp_path / "out.jsonl"
        wrote = await asyncio.to_thread(
            run, "batch", "results", batch_id, "-o", str(out), "--url", url
        )
        assert wrote.returncode == 0 and "wrote 303 results" in wrote.stderr
        assert sorted(out.read_text().splitlines()) == sorted(printed.stdout.splitlines())

        queued = await asyncio.to_thread(run, "batch", "submit", str(prompts), "--url", url)
        assert queued.returncode == 0, queued.stderr
        other = json.loads(queued.stdout)["batch_id"]
        cancelled = await asyncio.to_thread(run, "batch", "cancel", other, "--url", url)
        assert json.loads(cancelled.stdout)["status"] in ("cancelled", "completed")


async def test_errors_are_one_line(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    not_object = write_jsonl(tmp_path / "list.jsonl", [["a", "b"]])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    unknown_model = write_jsonl(
        tmp_path / "model.jsonl", [{"custom_id": "m", "prompt": "x", "model": "nope"}]
    )
    twice = write_jsonl(tmp_path / "twice.jsonl", [{"custom_id": "a", "prompt": "x"}] * 2)
    async with batch_server("live", tmp_path, run_worker=False, max_batch_requests=2) as server:
        url = str(server.client.base_url)
        big = write_jsonl(tmp_path / "big.jsonl", ["a", "b", "c"])
        cases = [
            ((str(bad_json),), f"{bad_json}:2: not JSON"),
            ((str(not_object),), f"{not_object}:1: each line must be a JSON object"),
            ((str(empty),), "holds no requests"),
            ((str(tmp_path / "absent.jsonl"),), "cannot read"),
            ((str(unknown_model),), "custom_id 'm'): no model 'nope'"),
            ((str(twice),), "custom_id 'a' is also requests[0]"),
            ((str(big),), "at most 2"),
        ]
        for args, needle in cases:
            done = await asyncio.to_thread(run, "batch", "submit", *args, "--url", url)
            assert_one_line_error(done, needle)
        for command in ("status", "results", "cancel"):
            done = await asyncio.to_thread(run, "batch", command, "task_missing", "--url", url)
            assert_one_line_error(done, "no batch with id 'task_missing'")
        assert await server.task_ids() == []
