"""Every Python example in the README runs, and does what the README says."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, JobStatus
from backburner.providers import ModelRouter

from .helpers import running_worker
from .live_server import live_server

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON = re.findall(r"```python\n(.*?)```", README, re.S)
BASH = re.findall(r"```bash\n(.*?)```", README, re.S)
TOML = re.findall(r"```toml\n(.*?)```", README, re.S)
DEFAULT_URL = "http://127.0.0.1:8000"


def block(blocks: list[str], marker: str) -> str:
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"expected one README block with {marker!r}"
    return found[0]


def test_every_python_example_is_covered() -> None:
    markers = (
        "backburner.client import",
        "asyncio.run(main())",
        "class RateLimited",
        "req-42",
        "ctx.llm.generate",
        "@bb.pipeline",
    )
    assert len(PYTHON) == len(markers)
    for marker in markers:
        block(PYTHON, marker)


def test_curl_example_against_a_live_server(tmp_path: Path) -> None:
    script = block(BASH, "curl -s -X POST")
    with live_server(tmp_path) as server:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script.replace(DEFAULT_URL, server.url)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    job_json, _, events = done.stdout.partition("retry: 1000")
    assert json.loads(job_json)["type"] == "generate"
    assert "event: token" in events and '"status":"completed"' in events


def test_client_example_against_a_live_server(tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(block(PYTHON, "backburner.client import").replace(DEFAULT_URL, "{url}"))
    with live_server(tmp_path) as server:
        script.write_text(script.read_text().replace("{url}", server.url))
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    tokens, status = done.stdout.strip().splitlines()
    assert len(tokens.split()) == 12 and status == "completed"


def test_quickstart_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(block(PYTHON, "asyncio.run(main())"))
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
    for source in (block(PYTHON, "class RateLimited"), block(PYTHON, "req-42")):
        code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
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


def test_models_toml_example_loads_as_described(tmp_path: Path) -> None:
    (toml,) = TOML
    path = tmp_path / "models.toml"
    path.write_text(toml)
    router = ModelRouter.from_source(str(path))
    assert [r.name for r in router.chain(None)] == ["gpt-4o-mini", "llama3.2"]
    assert router.route(None).max_concurrent == 20
    assert router.route("llama3.2").base_url == "http://127.0.0.1:11434/v1"


async def test_ctx_llm_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(block(PYTHON, "ctx.llm.generate"), "README-ctx-llm", "exec"), namespace)
    bb: Backburner = namespace["bb"]
    async with bb, running_worker(bb, concurrency=2):
        job = await bb.enqueue("answer", {"question": "What is a lease?"})
        done = await bb.wait(job.task_id, timeout=30)
    assert done.status is JobStatus.COMPLETED, done.error
    assert done.result is not None and done.result["model"] == "simulated"
    assert len(done.result["text"].split()) == 32
    tokens = [e.data for e in await bb.events(job.task_id) if e.type == "token"]
    assert sum(t["tokens"] for t in tokens) == 32
    assert "".join(t["text"] for t in tokens) == done.result["text"]


def test_tenant_keys_example_against_a_live_server(tmp_path: Path) -> None:
    create, serve, curl = [
        line.split("#")[0].strip() for line in block(BASH, "keys create").splitlines()
    ]
    assert serve.startswith("backburner serve")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    made = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"{create}; echo $KEY"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    keys_file = tmp_path / "backburner-keys.json"
    assert key.startswith("bb_") and key not in keys_file.read_text()
    with live_server(tmp_path, keys_file=str(keys_file)) as server:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", curl.replace(DEFAULT_URL, server.url)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "KEY": key},
        )
        refused = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", curl.replace(DEFAULT_URL, server.url)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "KEY": "bb_not-a-key"},
        )
    assert done.returncode == 0, done.stderr
    usage = json.loads(done.stdout)
    assert (usage["tenant"], usage["max_in_flight"], usage["in_flight"]) == ("acme", 5, 0)
    assert json.loads(refused.stdout)["error"]["type"] == "unauthorized"


async def test_pipeline_example_runs() -> None:
    from backburner import Settings

    bb = Backburner("memory://", settings=Settings(pipeline_poll_s=0.5))
    namespace: dict[str, Any] = {"bb": bb}
    exec(compile(block(PYTHON, "@bb.pipeline"), "README-pipeline", "exec"), namespace)
    async with bb, running_worker(bb, concurrency=1):
        job = await bb.enqueue("research", {"question": "leases"})
        done = await bb.wait(job.task_id, timeout=30)
        children = await bb.list(parent_id=job.task_id)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result == {"answer": "leases: 2 passages"}
    assert sorted(c.input["query"] for c in children.jobs) == ["history of leases", "leases"]
    assert {c.priority for c in children.jobs} == {10}  # interactive
