"""Real worker processes sharing one SQLite file or one Redis, stopped with real signals."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backburner import Backburner, Job, JobStatus, Settings

from ..helpers import WorkerProcesses, eventually

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Spawn]:
    workers = WorkerProcesses(tmp_path)

    def start(*, concurrency: int = 10, **settings: float) -> subprocess.Popen[bytes]:
        env = {"BACKBURNER_BACKEND_URL": db_url}
        base = {
            "lease_s": 2.0,
            "heartbeat_s": 0.5,
            "sweep_interval_s": 0.2,
            "cancel_poll_s": 0.1,
            "shutdown_grace_s": 10.0,
        }
        for name, value in {**base, **settings}.items():
            env[f"BACKBURNER_{name.upper()}"] = str(value)
        return workers.start("tests.workerapp:bb", "--concurrency", str(concurrency), env=env)

    yield start
    workers.stop()


@pytest.fixture
async def bb(db_url: str) -> Backburner:
    app = Backburner(db_url, settings=Settings(backend_url=db_url))
    from tests import workerapp

    app.tasks.update(workerapp.bb.tasks)
    await app.connect()
    yield app  # type: ignore[misc]
    await app.close()


async def wait_registered(bb: Backburner, proc: subprocess.Popen[bytes]) -> str:
    found: list[str] = []

    async def seen() -> bool:
        assert proc.poll() is None, "worker process exited"
        stats = await bb.backend.stats(now=time.time())
        found[:] = [w.worker_id for w in stats.workers if f":{proc.pid}:" in w.worker_id]
        return bool(found)

    await eventually(seen, timeout=30, message="worker registered")
    return found[0]


async def wait_started(bb: Backburner, task_id: str) -> None:
    """Until the job's handler runs (its first event): a job claimed for a worker is
    ``processing`` before the worker has it (a hand-off is claimed by the enqueue), and a
    worker that stops before taking it hands it back unstarted."""

    async def ticked() -> bool:
        return any(e.type == "tick" for e in await bb.events(task_id))

    await eventually(ticked, timeout=30, message="started")


async def start_running(
    bb: Backburner, spawn: Spawn, payload: dict[str, object], **settings: float
) -> tuple[subprocess.Popen[bytes], Job]:
    """A fresh worker process, and a job of ours that it has started."""
    proc = spawn(**settings)
    await wait_registered(bb, proc)
    job = await bb.enqueue("sleepy", payload)
    await wait_started(bb, job.task_id)
    return proc, job


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    await eventually(lambda: proc.poll() is not None, timeout=timeout, message="process exit")
    return proc.returncode


async def test_sigkill_mid_job_another_worker_finishes_it(
    bb: Backburner, spawn: Spawn, tmp_path: Path
) -> None:
    first = spawn()
    await wait_registered(bb, first)
    # Long enough to outlast the second worker's start (seconds on a busy machine); its
    # rerun is short.
    payload = {"seconds": 60, "retry_seconds": 1.0, "marker_dir": str(tmp_path)}
    job = await bb.enqueue("sleepy", payload)
    await wait_started(bb, job.task_id)
    second = spawn()
    await wait_registered(bb, second)
    first.kill()  # SIGKILL: no cleanup, the lease must expire
    assert first.wait(10) == -signal.SIGKILL
    done = await bb.wait(job.task_id, timeout=60)
    assert done.status == JobStatus.COMPLETED
    assert done.result["pid"] == second.pid
    assert done.attempts == 2
    assert [h.outcome for h in done.history] == ["retry", "completed"]
    assert done.history[0].error is not None
    assert done.history[0].error.type == "lease_expired"
    starts = [
        line
        for line in (tmp_path / job.task_id).read_text().splitlines()
        if line.startswith("start")
    ]
    assert [s.split()[1] for s in starts] == [str(first.pid), str(second.pid)]
    statuses = [e.data["status"] for e in await bb.events(job.task_id) if e.type == "status"]
    assert statuses == ["queued", "processing", "queued", "processing", "completed"]


async def test_sigterm_lets_the_running_job_finish(bb: Backburner, spawn: Spawn) -> None:
    proc, job = await start_running(bb, spawn, {"seconds": 1.0}, shutdown_grace_s=20)
    proc.send_signal(signal.SIGTERM)
    assert await wait_exit(proc, 30) == 0
    done = await bb.get(job.task_id)
    assert done.status == JobStatus.COMPLETED and done.result["pid"] == proc.pid


async def test_sigterm_past_the_grace_period_hands_the_job_back(
    bb: Backburner, spawn: Spawn
) -> None:
    proc, job = await start_running(bb, spawn, {"seconds": 60}, shutdown_grace_s=0.5)
    proc.send_signal(signal.SIGTERM)
    assert await wait_exit(proc, 30) == 0
    back = await bb.get(job.task_id)
    assert back.status == JobStatus.QUEUED
    assert back.attempts == 0
    assert back.history[-1].outcome == "released"


async def test_second_sigterm_exits_at_once(bb: Backburner, spawn: Spawn, tmp_path: Path) -> None:
    proc, job = await start_running(bb, spawn, {"seconds": 60}, shutdown_grace_s=120)
    proc.send_signal(signal.SIGTERM)
    log = tmp_path / "worker-0.log"
    # Two signals sent back to back may merge into one: send the second once the first is in.
    await eventually(lambda: "shutting down" in log.read_text(), timeout=30, message="1st")
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    await wait_exit(proc, 30)
    assert time.monotonic() - started < 5
    back = await bb.get(job.task_id)
    assert back.status == JobStatus.QUEUED and back.attempts == 0


async def test_cancel_reaches_a_worker_in_another_process_within_a_second(
    bb: Backburner, spawn: Spawn, tmp_path: Path
) -> None:
    proc = spawn()
    await wait_registered(bb, proc)
    job = await bb.enqueue("sleepy", {"seconds": 60, "marker_dir": str(tmp_path)})
    await eventually(lambda: (tmp_path / job.task_id).exists(), timeout=30, message="started")
    asked = time.time()
    cancelled = await bb.cancel(job.task_id)
    assert cancelled.status == JobStatus.CANCELLED

    def stopped() -> bool:
        return "stop" in (tmp_path / job.task_id).read_text()

    await eventually(stopped, timeout=10, message="handler stopped")
    stop_line = next(
        line
        for line in (tmp_path / job.task_id).read_text().splitlines()
        if line.startswith("stop")
    )
    assert float(stop_line.split()[2]) - asked < 1.0
    final = await bb.get(job.task_id)
    assert final.status == JobStatus.CANCELLED
    assert [e.type for e in await bb.events(job.task_id)][-2:] == ["tick", "status"]
    # The worker is still healthy and runs the next job.
    nxt = await bb.enqueue("noop")
    assert (await bb.wait(nxt.task_id, timeout=30)).status == JobStatus.COMPLETED


async def test_several_workers_share_one_store_and_run_each_job_once(
    bb: Backburner, spawn: Spawn, tmp_path: Path
) -> None:
    procs = [spawn(concurrency=20) for _ in range(3)]
    for proc in procs:
        await wait_registered(bb, proc)
    jobs = [
        await bb.enqueue("sleepy", {"seconds": 0.01, "marker_dir": str(tmp_path)})
        for _ in range(300)
    ]
    done = [await bb.wait(job.task_id, timeout=120) for job in jobs]
    assert all(j.status == JobStatus.COMPLETED and j.attempts == 1 for j in done)
    for job in jobs:
        lines = (tmp_path / job.task_id).read_text().splitlines()
        assert len([line for line in lines if line.startswith("start")]) == 1
    pids = {j.result["pid"] for j in done}
    assert len(pids) >= 2, f"one worker took every job: {pids}"


PRODUCER = """
import asyncio, sys
from backburner import Backburner, Settings
from tests import workerapp

async def main():
    bb = Backburner(sys.argv[1], settings=Settings(backend_url=sys.argv[1]))
    bb.tasks.update(workerapp.bb.tasks)
    jobs = await asyncio.gather(*[
        bb.enqueue("noop", {}, idempotency_key="same-key") for _ in range(25)
    ])
    print("\\n".join(j.task_id for j in jobs))
    await bb.close()

asyncio.run(main())
"""


async def test_idempotent_enqueue_across_processes_makes_one_job(
    bb: Backburner, db_url: str
) -> None:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PRODUCER,
            db_url,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outputs = [await asyncio.wait_for(p.communicate(), 60) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    ids = {line for out, _ in outputs for line in out.decode().split()}
    assert len(ids) == 1
    page = await bb.list(limit=1000)
    assert [j.task_id for j in page.jobs] == list(ids)


@pytest.mark.timeout(60)
async def test_a_sigterm_while_the_backend_connects_ends_the_process() -> None:
    # As PID 1 (the container images) a signal without a handler is ignored: a SIGTERM that came
    # while the worker connected was lost, and it went on to start and claim jobs. Not PID 1
    # here, so the handler shows in the exit status: 143 (128 + SIGTERM), not -15.
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        silent.settimeout(30)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        proc = subprocess.Popen(
            [sys.executable, "-m", "backburner", "worker", "--backend", url],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            connection, _ = await asyncio.to_thread(silent.accept)  # it is connecting now
            with connection:  # (open and silent: its connect waits for an answer)
                proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(proc.wait, 10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert code == 128 + signal.SIGTERM
