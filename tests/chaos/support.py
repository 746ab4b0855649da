"""Machinery for chaos tests: worker processes, a redis-server of our own, markers, figures."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from backburner import Backburner, Job, JobStatus, Settings
from backburner.models import is_terminal_event

from ..helpers import eventually, free_port

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("BACKBURNER_CHAOS_FULL", "") == "1"
"""Run the long versions (by hand); the default is the small version CI runs."""
IN_CI = os.environ.get("CI", "").lower() == "true"

WORKER_SETTINGS: dict[str, float] = {
    "lease_s": 2.0,
    "heartbeat_s": 0.5,
    "sweep_interval_s": 0.2,
    "cancel_poll_s": 0.2,
    "idle_wait_s": 0.5,
    "shutdown_grace_s": 5.0,
    "retry_base_s": 0.05,
    "retry_cap_s": 0.5,
}
"""Short leases so that takeovers happen within seconds (passed as BACKBURNER_* env vars)."""


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def report(title: str, figures: dict[str, Any]) -> None:
    """Print the figures (visible with -s); append them to $BACKBURNER_CHAOS_REPORT if set."""
    lines = [f"\n== chaos figures: {title} =="]
    lines += [f"  {name:<40} {value}" for name, value in figures.items()]
    print("\n".join(lines), flush=True)
    target = os.environ.get("BACKBURNER_CHAOS_REPORT")
    if target:
        with open(target, "a") as out:
            out.write(json.dumps({"title": title, "full": FULL, **figures}, default=str) + "\n")


def unavailable(reason: str) -> None:
    """Skip locally; fail in CI (CI=true), where a missing Redis must not pass silently."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: Redis tests must run)")
    pytest.skip(reason)


def require_redis_backend() -> None:
    """Skip (fail in CI) unless the redis-server binary and redis-py are installed."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed")
    try:
        import redis  # noqa: F401
    except ImportError:
        unavailable("redis-py is not installed: pip install 'backburner[redis]'")


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return round(ordered[rank - 1], 3)


async def open_jobs(app: Backburner) -> int:
    """Jobs not terminal yet (queued or processing)."""
    counts = (await app.backend.stats(now=time.time())).counts
    return counts.get(JobStatus.QUEUED, 0) + counts.get(JobStatus.PROCESSING, 0)


# -- processes -------------------------------------------------------------------------------


def ps_leftovers(pids: Iterable[int]) -> list[str]:
    """Lines of ``ps`` for any of ``pids`` still present (zombies included)."""
    wanted = set(pids)
    out = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if int(line.split()[0]) in wanted]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:  # pragma: no cover - a stopped (SIGSTOP) process
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(15)


class Cluster:
    """Worker processes (``backburner worker tests.chaosapp:bb``) on one backend URL."""

    def __init__(self, url: str, log_dir: Path, **settings: float) -> None:
        self.url = url
        self.log_dir = log_dir
        self.settings = {**WORKER_SETTINGS, **settings}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[BinaryIO] = []

    def env(self) -> dict[str, str]:
        env = {**os.environ, "BACKBURNER_BACKEND_URL": self.url}
        for name, value in self.settings.items():
            env[f"BACKBURNER_{name.upper()}"] = str(value)
        return env

    def spawn(self, name: str, *, concurrency: int) -> subprocess.Popen[bytes]:
        out = (self.log_dir / f"worker-{name}-{len(self.procs)}.log").open("wb")
        self._logs.append(out)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "backburner",
                "worker",
                "tests.chaosapp:bb",
                "--concurrency",
                str(concurrency),
            ],
            cwd=ROOT,
            env=self.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def start_script(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Another process of ours (e.g. the producer), stopped with the workers."""
        out = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(out)
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=self.env(), stdout=out, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> float:
        """SIGKILL and reap; returns when the signal was sent (Unix time)."""
        at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait(15)
        return at

    def logs(self, proc: subprocess.Popen[bytes]) -> str:
        index = self.procs.index(proc)
        return Path(self._logs[index].name).read_text(errors="replace")

    def all_logs(self) -> str:
        return "".join(Path(f.name).read_text(errors="replace") for f in self._logs)

    def stop_all(self) -> None:
        for proc in self.procs:
            _stop(proc)
        for out in self._logs:
            out.close()


async def wait_registered(app: Backburner, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The worker id of ``proc`` once it has heartbeated (it is running its loops)."""
    found: list[str] = []

    async def seen() -> bool:
        assert proc.poll() is None, f"worker {proc.pid} exited with {proc.returncode}"
        stats = await app.backend.stats(now=time.time())
        found[:] = [w.worker_id for w in stats.workers if f":{proc.pid}:" in w.worker_id]
        return bool(found)

    await eventually(seen, timeout=timeout, message=f"worker {proc.pid} registered")
    return found[0]


# -- redis-server ----------------------------------------------------------------------------


class _PortTaken(RuntimeError):
    """redis-server could not bind its port: another process has it."""


class RedisServer:
    """A redis-server of our own on a free port, with its own dir (killable, restartable)."""

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool,
        port: int | None = None,
        config: Sequence[str] = (),
    ) -> None:
        """``config``: more arguments for redis-server (config lines, as ``--name value``)."""
        self.dir = directory
        self.config = tuple(config)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self._port_chosen = port is None
        """Ours to change if another process takes it before the first start binds it."""
        self._started = False
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []
        self._log = self.dir / "redis.log"

    def url(self, prefix: str, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}?prefix={prefix}"

    def start(self, timeout: float = 30.0) -> float:
        """Start it and wait until it answers PING (AOF loaded); returns that time. A port we
        chose that another process took meanwhile (an outgoing connection's, from the same
        range) is chosen again, before the first start: restarts keep theirs."""
        tries = 0
        while True:
            try:
                at = self._start(timeout)
            except _PortTaken:
                tries += 1
                if not self._port_chosen or self._started or tries > 3:
                    raise
                self.port = free_port()
                continue
            self._started = True
            return at

    def _start(self, timeout: float) -> float:
        args = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self._log),
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        args += self.config
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pids.append(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self._log.read_text()[-2000:] if self._log.exists() else ""
                if "Address already in use" in log:
                    raise _PortTaken(f"redis-server exited: {log}")
                raise RuntimeError(f"redis-server exited: {log}")
            if self.ping():
                return time.time()
            time.sleep(0.01)
        raise RuntimeError(f"redis-server on {self.port} did not answer within {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> float:
        """kill -9 and reap; returns when the signal was sent (Unix time)."""
        assert self.proc is not None
        at = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(15)
        return at

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def log_tail(self, chars: int = 3000) -> str:
        return self._log.read_text(errors="replace")[-chars:] if self._log.exists() else ""


def started_redis(tmp_path: Path, *config: str) -> Iterator[RedisServer]:
    """A redis-server of the test's own (no persistence), with these config lines, for a
    fixture to ``yield from``."""
    require_redis_backend()
    server = RedisServer(tmp_path / "redis", appendonly=False, config=config)
    try:
        server.start()  # (one that never answered is stopped too)
        yield server
    finally:
        server.stop()


# -- markers (written by tests/chaosapp.py) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mark:
    kind: str
    pid: int
    fence: int
    at: float
    attempt: int | None = None
    seq: int | None = None
    """For ``emit-ok``: the seq the backend gave the event."""


def read_marks(marker_dir: Path) -> dict[str, list[Mark]]:
    marks: dict[str, list[Mark]] = {}
    for path in marker_dir.iterdir():
        found: list[Mark] = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts[0] == "start":
                found.append(
                    Mark("start", int(parts[1]), int(parts[3]), float(parts[4]), int(parts[2]))
                )
            else:
                seq = int(parts[3]) if len(parts) == 5 else None
                pid, fence, at = int(parts[1]), int(parts[2]), float(parts[-1])
                found.append(Mark(parts[0], pid, fence, at, seq=seq))
        marks[path.name] = found
    return marks


# -- what a client sees ----------------------------------------------------------------------


def worker_pid(worker_id: str | None) -> int | None:
    """The pid in a worker id ``host:pid:random``."""
    if not worker_id:
        return None
    try:
        return int(worker_id.rsplit(":", 2)[-2])
    except (IndexError, ValueError):
        return None


@dataclass(slots=True)
class LogCheck:
    """What one job's event log says about exactly-once and fencing."""

    terminal_events: int = 0
    last_is_terminal: bool = False
    completed_result: Any = None
    stale_events: list[dict[str, Any]] = field(default_factory=list)
    """Handler events written by an attempt that did not hold the job at that point."""


def check_event_log(events: list[Any]) -> LogCheck:
    """Walk the log: the k-th ``processing`` status event opens attempt fence=k (every claim
    increments the fence once); a handler's ``tick`` must quote that fence and that worker's
    pid, and may only appear while the job is processing."""
    check = LogCheck()
    fence = 0
    holder: tuple[int, int | None] | None = None
    for event in events:
        if event.type == "status":
            status = event.data.get("status")
            if status == "processing":
                fence += 1
                holder = (fence, worker_pid(event.data.get("worker_id")))
            else:
                holder = None
            if is_terminal_event(event):
                check.terminal_events += 1
                if status == "completed":
                    check.completed_result = event.data.get("result")
        elif event.type == "tick":
            data = event.data
            ok = (
                holder is not None
                and data.get("fence") == holder[0]
                and holder[1] in (None, data.get("pid"))
            )
            if not ok:
                check.stale_events.append({"seq": event.seq, **data, "holder": holder})
    check.last_is_terminal = bool(events) and is_terminal_event(events[-1])
    return check


def problems_of(job: Job, check: LogCheck) -> list[str]:
    """Why ``job`` (completed) does not show exactly one terminal state and one result."""
    found = []
    if check.terminal_events != 1:
        found.append(f"{check.terminal_events} terminal events")
    if not check.last_is_terminal:
        found.append("events after the terminal one")
    if check.completed_result != job.result:
        found.append(f"event result {check.completed_result} != job result {job.result}")
    result = job.result if isinstance(job.result, dict) else {}
    if result.get("fence") != job.fence:
        found.append(f"result from fence {result.get('fence')}, job fence {job.fence}")
    last = job.history[-1] if job.history else None
    if (
        last is None
        or last.outcome != "completed"
        or worker_pid(last.worker_id) != result.get("pid")
    ):
        found.append(f"result pid {result.get('pid')} is not the last attempt's: {last}")
    if [h.outcome for h in job.history].count("completed") != 1:
        found.append(f"history outcomes {[h.outcome for h in job.history]}")
    return found


def make_app(url: str) -> Backburner:
    """A client app in the test process that knows the chaos task."""
    from tests import chaosapp

    app = Backburner(url, settings=Settings(backend_url=url))
    app.tasks.update(chaosapp.bb.tasks)
    return app
