"""What the peer adapters share: Redis db 8, worker processes, producer loops.

The jobs themselves report through ``probe`` (see there): drain and sleeper times run from the
first job's start to the last job's completion, pickup latency from just before the enqueue
call to the job's start.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis
import redis.asyncio as aredis

from .probe import KEY_DONE, KEY_FIRST, KEY_LAST, KEY_PICKUP, REDIS_URL

REDIS_DB = 8
BENCH_DIR = Path(__file__).resolve().parents[1]
LOG_DIR = Path(tempfile.gettempdir()) / "backburner-peers-bench"

IN_FLIGHT = 64
BULK_IN_FLIGHT = 1_000
"""As many enqueues in flight as rq's enqueue_many puts in one pipeline (a bulk submission)."""
SEQUENTIAL = "sequential"
SEQUENTIAL_UVLOOP = "sequential, uvloop"
"""One at a time with the producer on uvloop: each enqueue is a few loop turns, which uvloop
makes cheaper (backburner's own API process runs on it, as uvicorn does where it is installed)."""
CONCURRENT = f"{IN_FLIGHT} in flight"
BULK = f"{BULK_IN_FLIGHT:,} in flight"
WIDTHS = {CONCURRENT: IN_FLIGHT, BULK: BULK_IN_FLIGHT}
MAX_REDIS_CLIENTS = 6_000
WARMUP_TIMEOUT_S = 60.0
PICKUP_TIMEOUT_S = 10.0


class BenchError(RuntimeError):
    """A run that did not finish: the worker died, or a deadline passed."""


def concurrency() -> int:
    """The worker's concurrency, as the benchmark passed it (BENCH_CONCURRENCY)."""
    return int(os.environ.get("BENCH_CONCURRENCY", "100"))


# -- Redis housekeeping, in the benchmark process ----------------------------------------------


def redis_client() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL)
    if client.connection_pool.connection_kwargs.get("db") != REDIS_DB:
        raise BenchError("the benchmark must only ever use Redis db 8")
    return client


def flush(wait_s: float = 60.0) -> None:
    """Empty db 8 (only db 8: never FLUSHALL). A Redis still full of a stopped peer's
    connections (it closes them as it reads their ends) is given ``wait_s`` to let them go."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with redis_client() as client:
                client.flushdb()
            return
        except redis.ConnectionError as exc:
            if "max number of clients" not in str(exc) or time.monotonic() > deadline:
                raise BenchError(f"cannot empty db {REDIS_DB}: {exc}") from None
            time.sleep(0.5)


# -- worker processes --------------------------------------------------------------------------


def shown(scenario: str, jobs: int) -> str:
    """A concurrency as the table shows it: "N" (the job count) for the sleepers."""
    return "N" if scenario == "sleepers" else str(jobs)


def tool(name: str) -> str:
    """A console script of the environment running the benchmark (the bench venv)."""
    return str(Path(sys.executable).parent / name)


@dataclass(frozen=True)
class WorkerSpec:
    """How to start one worker process: a label for the table, its argv, extra env."""

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc."""
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    parents = {pid: _parent_of(pid) for pid in pids}
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, ppid in parents.items() if ppid in frontier]
        tree += children
        frontier = children
    return tree


def peak_rss_kb(pid: int) -> int:
    """VmHWM (peak resident set) of one process, 0 if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class WorkerProcess:
    """A worker in its own session (process group), stopped by group id in ``stop``."""

    live: ClassVar[set[WorkerProcess]] = set()

    def __init__(self, name: str, spec: WorkerSpec) -> None:
        LOG_DIR.mkdir(exist_ok=True)
        safe = "".join(c if c.isalnum() else "-" for c in f"{name}-{spec.label}")
        self.log_path = LOG_DIR / f"{safe}.log"
        self.name = f"{name} [{spec.label}]"
        # The caller's PYTHONPATH after ours: an A/B run points it at another checkout.
        path = os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **spec.env}
        self.spawned_at = time.time()
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                spec.argv,
                cwd=BENCH_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        WorkerProcess.live.add(self)

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise BenchError(f"{self.name} exited with {code}: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:]) + f" (log: {self.log_path})"

    def peak_rss_mb(self) -> float:
        """The peak RSS of the worker, summed over its processes (a prefork pool has several)."""
        return sum(peak_rss_kb(pid) for pid in process_tree(self.proc.pid)) / 1024

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the worker's process group, SIGKILL it after ``grace_s``.

        Children that left the group (rq's work horse calls setsid) are SIGKILLed by pid.
        """
        WorkerProcess.live.discard(self)
        strays = process_tree(self.proc.pid)[1:]
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        self._signal(signal.SIGKILL)  # also any child the leader left behind
        self.proc.wait(30)
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    @classmethod
    def stop_all(cls) -> None:
        for worker in list(cls.live):
            worker.stop(grace_s=2.0)


@dataclass
class Finish:
    elapsed_s: float
    """First job start to last completion."""
    from_spawn_s: float
    """Worker process start (so its imports and connecting too) to last completion."""
    peak_rss_mb: float
    redis_clients: int


def wait_done(worker: WorkerProcess, count: int, deadline_s: float) -> Finish:
    """Wait until the probe counted ``count`` completions; read the worker's peak RSS."""
    end = time.monotonic() + deadline_s
    peak_clients = 0
    with redis_client() as client:
        while True:
            done = int(client.get(KEY_DONE) or 0)
            if done >= count:
                break
            worker.check_alive()
            if time.monotonic() > end:
                raise BenchError(f"timeout: {done}/{count} done after {deadline_s:.0f} s")
            clients = int(client.info("clients")["connected_clients"])
            if clients > MAX_REDIS_CLIENTS:  # the Redis is shared (maxclients 10,000)
                raise BenchError(f"stopped: over {MAX_REDIS_CLIENTS:,} Redis connections")
            peak_clients = max(peak_clients, clients)
            time.sleep(0.05)
        rss = worker.peak_rss_mb()
        first = min(float(t) for t in client.hvals(KEY_FIRST))
        last = max(float(t) for t in client.hvals(KEY_LAST))
    return Finish(last - first, last - worker.spawned_at, rss, peak_clients)


# -- producers ---------------------------------------------------------------------------------


def _latency_ms(started: Any, before: float) -> float:
    if started is None:
        raise BenchError("timeout: a ping job did not start")
    return (float(started[1]) - before) * 1000


def idle_gap(rng: random.Random) -> float:
    """20-50 ms between pings: the worker goes idle, and a worker that polls every few ms
    is met at random points of its poll (a fixed gap would phase-lock with the poll)."""
    return 0.02 + 0.03 * rng.random()


def pickup_sync(submit: Callable[[], object], count: int) -> list[float]:
    """Enqueue ``count`` pings one at a time on an idle worker (after one warm-up ping)."""
    latencies, rng = [], random.Random(8)
    with redis_client() as client:
        for i in range(count + 1):
            before = time.time()
            submit()
            timeout = WARMUP_TIMEOUT_S if i == 0 else PICKUP_TIMEOUT_S
            latency = _latency_ms(client.blpop([KEY_PICKUP], timeout), before)
            if i:
                latencies.append(latency)
            time.sleep(idle_gap(rng))
    return latencies


async def pickup_async(submit: Callable[[], Awaitable[object]], count: int) -> list[float]:
    latencies, rng = [], random.Random(8)
    client = aredis.Redis.from_url(REDIS_URL)
    try:
        for i in range(count + 1):
            before = time.time()
            await submit()
            timeout = WARMUP_TIMEOUT_S if i == 0 else PICKUP_TIMEOUT_S
            latency = _latency_ms(await client.blpop([KEY_PICKUP], timeout), before)
            if i:
                latencies.append(latency)
            await asyncio.sleep(idle_gap(rng))
    finally:
        await client.aclose()
    return latencies


async def in_flight(submit: Callable[[], Awaitable[object]], count: int, width: int) -> None:
    """Call ``submit`` ``count`` times with ``width`` calls in flight."""
    remaining = count

    async def lane() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await submit()

    await asyncio.gather(*(lane() for _ in range(min(width, count))))


class Peer:
    """One queue under test: its producer side and how to start its worker."""

    name: ClassVar[str]
    dists: ClassVar[tuple[str, ...]]
    enqueue_modes: ClassVar[tuple[str, ...]] = (SEQUENTIAL,)
    not_applicable: ClassVar[dict[str, str]] = {}
    """scenario -> why this peer cannot run it."""
    setup: ClassVar[str] = ""
    """How it is set up, for the report: broker, what it stores, what its worker is."""

    def reset(self) -> None:
        """Forget state kept outside Redis db 8 (flushed by the benchmark before each run)."""

    def enqueue(self, mode: str, count: int) -> float:
        """Enqueue ``count`` no-op jobs; return jobs per second."""
        raise NotImplementedError

    def fill(self, task: str, count: int) -> None:
        """Enqueue ``count`` jobs of ``task`` ("noop" or "nap") as fast as it can."""
        raise NotImplementedError

    def pickup(self, count: int) -> list[float]:
        """Pickup latencies (ms) of ``count`` "ping" jobs enqueued one at a time."""
        raise NotImplementedError

    def workers(self, scenario: str, count: int) -> list[WorkerSpec]:
        """The worker settings to measure ``scenario`` with (``count``: jobs in the run)."""
        raise NotImplementedError


def run_producer(main: Coroutine[Any, Any, Any], *, on_uvloop: bool = False) -> Any:
    """Run an asyncio producer on asyncio's own event loop, or on uvloop's."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if on_uvloop:
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


class AsyncPeer(Peer):
    """A peer whose producer is asyncio: sequential awaits, or many in flight."""

    enqueue_modes = (SEQUENTIAL, SEQUENTIAL_UVLOOP, CONCURRENT, BULK)

    async def connect(self) -> Any:
        raise NotImplementedError

    async def submit(self, client: Any, task: str) -> None:
        raise NotImplementedError

    async def close(self, client: Any) -> None:
        raise NotImplementedError

    def enqueue(self, mode: str, count: int) -> float:
        return run_producer(self._enqueue(mode, count), on_uvloop=mode == SEQUENTIAL_UVLOOP)

    async def _enqueue(self, mode: str, count: int) -> float:
        client = await self.connect()
        try:
            start = time.perf_counter()
            if mode in (SEQUENTIAL, SEQUENTIAL_UVLOOP):
                for _ in range(count):
                    await self.submit(client, "noop")
            else:
                await in_flight(lambda: self.submit(client, "noop"), count, WIDTHS[mode])
            return count / (time.perf_counter() - start)
        finally:
            await self.close(client)

    def fill(self, task: str, count: int) -> None:
        asyncio.run(self._fill(task, count))

    async def _fill(self, task: str, count: int) -> None:
        client = await self.connect()
        try:
            await in_flight(lambda: self.submit(client, task), count, IN_FLIGHT)
        finally:
            await self.close(client)

    def pickup(self, count: int) -> list[float]:
        return asyncio.run(self._pickup(count))

    async def _pickup(self, count: int) -> list[float]:
        client = await self.connect()
        try:
            return await pickup_async(lambda: self.submit(client, "ping"), count)
        finally:
            await self.close(client)


class SyncPeer(Peer):
    """A peer whose producer is a plain blocking client."""

    def connect(self) -> Any:
        raise NotImplementedError

    def submit(self, client: Any, task: str) -> None:
        raise NotImplementedError

    def submit_batch(self, client: Any, task: str, count: int) -> None:
        """Enqueue ``count`` jobs in one go, where the peer has a batch API."""
        for _ in range(count):
            self.submit(client, task)

    def close(self, client: Any) -> None:
        """Release the producer's connections."""

    def enqueue(self, mode: str, count: int) -> float:
        client = self.connect()
        try:
            start = time.perf_counter()
            if mode == SEQUENTIAL:
                for _ in range(count):
                    self.submit(client, "noop")
            else:
                self.submit_batch(client, "noop", count)
            return count / (time.perf_counter() - start)
        finally:
            self.close(client)

    def fill(self, task: str, count: int) -> None:
        client = self.connect()
        try:
            self.submit_batch(client, task, count)
        finally:
            self.close(client)

    def pickup(self, count: int) -> list[float]:
        client = self.connect()
        try:
            return pickup_sync(lambda: self.submit(client, "ping"), count)
        finally:
            self.close(client)
