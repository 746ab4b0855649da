"""examples/client_poll.py and examples/client_stream.py, run as users run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live_server import LiveServer

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("BACKBURNER_URL", None)
    if url is not None:
        env["BACKBURNER_URL"] = url
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("how", ["argv", "env"])
def test_client_poll(server: LiveServer, how: str) -> None:
    done = (
        run("client_poll.py", server.url)
        if how == "argv"
        else run("client_poll.py", url=server.url)
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"submitted task_[0-9a-f]{32}", lines[0]), lines
    assert re.fullmatch(r"  completed\s+100\.0%", lines[-2]), lines
    assert all(re.fullmatch(r"  (queued|processing|completed)\s+\d+\.\d%", x) for x in lines[1:-1])
    assert lines[-1].startswith("result: ") and len(lines[-1].split()) == 1 + 24


def test_client_stream(server: LiveServer) -> None:
    done = run("client_stream.py", server.url)
    assert done.returncode == 0, done.stderr
    submitted, text, final = done.stdout.splitlines()
    assert re.fullmatch(r"submitted task_[0-9a-f]{32}", submitted)
    assert len(text.split()) == 24  # the tokens, streamed onto one line
    assert final == "completed: 24 tokens"
