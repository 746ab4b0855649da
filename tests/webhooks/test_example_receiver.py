"""examples/webhook_receiver.py accepts what backburner signs and refuses the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from backburner.webhooks import sign

from .conftest import SECRET
from .receiver import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_receiver_verifies_and_prints(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "webhook_receiver.py"), str(port)],
        env={**os.environ, "BACKBURNER_WEBHOOK_SECRET": SECRET},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("listening on")
        body = json.dumps({"type": "task.completed", "task_id": "task_1", "result": 1}).encode()
        headers = sign(SECRET, "msg_1", int(time.time()), body)
        url = f"http://127.0.0.1:{port}/hooks"
        assert httpx.post(url, content=body, headers=headers).status_code == 204
        assert httpx.post(url, content=body, headers=headers).status_code == 204  # a retry
        assert httpx.post(url, content=body + b" ", headers=headers).status_code == 400
        stale = sign(SECRET, "msg_2", int(time.time()) - 3600, body)
        assert httpx.post(url, content=body, headers=stale).status_code == 400
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    lines = out.strip().splitlines()
    assert lines[0].startswith("task.completed task_1:")  # printed once, not for the retry
    assert [line.split(":")[0] for line in lines[1:]] == ["refused", "refused"]
