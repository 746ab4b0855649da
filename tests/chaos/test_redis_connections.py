"""Dropped connections (Redis stays up): ``CLIENT KILL`` every worker connection, repeatedly.

A connection reset is the mildest backend failure there is (a proxy, a failover, an idle
timeout): the next command on a new connection succeeds. A job whose handler succeeded must
still end ``completed`` — at worst it runs again after its lease expires.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from backburner import Backburner, JobStatus

from .support import (
    FULL,
    Cluster,
    RedisServer,
    check_event_log,
    eventually,
    make_app,
    open_jobs,
    problems_of,
    ps_leftovers,
    report,
    require_redis_backend,
    wait_registered,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

JOBS = 1000 if FULL else 300
KILL_EVERY_S = 0.15

T = TypeVar("T")


async def retried(call: Callable[[], Awaitable[T]], attempts: int = 20) -> T:
    """Our own reads lose their connection too: try again (reads are idempotent)."""
    for _ in range(attempts - 1):
        try:
            return await call()
        except Exception:
            await asyncio.sleep(0.05)
    return await call()


@pytest.mark.timeout(600 if FULL else 120)
async def test_dropped_connections_never_fail_a_job_that_succeeded(tmp_path: Path) -> None:
    require_redis_backend()
    import redis  # the backend's own dependency: present once the backend is

    server = RedisServer(tmp_path / "redis", appendonly=False)
    cluster: Cluster | None = None
    app: Backburner | None = None
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        server.start()
        url = server.url("chaos")
        app = make_app(url)
        await app.connect()
        cluster = Cluster(url, tmp_path)
        workers = [cluster.spawn(f"w{i}", concurrency=20) for i in range(2)]
        for proc in workers:
            await wait_registered(app, proc, timeout=60)
        ids = [
            (await app.enqueue("chaos", {"seconds": 0.3, "marker_dir": str(markers)})).task_id
            for _ in range(JOBS)
        ]
        killer = redis.Redis(port=server.port)
        kills = 0

        async def drained() -> bool:
            nonlocal kills
            killer.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # type: ignore[no-untyped-call]
            killer.execute_command("CLIENT", "KILL", "TYPE", "pubsub")  # type: ignore[no-untyped-call]
            kills += 1
            try:
                return await open_jobs(app) == 0
            except Exception:
                return False

        started = time.monotonic()
        await eventually(
            drained, timeout=400 if FULL else 90, interval=KILL_EVERY_S, message="drained"
        )
        elapsed = time.monotonic() - started
        killer.close()
        for proc in workers:
            assert proc.poll() is None, f"worker died: {cluster.logs(proc)[-3000:]}"
        outcomes: Counter[str] = Counter()
        broken = {}
        for task_id in ids:
            job = await retried(partial(app.get, task_id))
            if job.status != JobStatus.COMPLETED:
                outcomes[f"{job.status}: {job.error.message if job.error else None}"] += 1
                continue
            outcomes["completed"] += 1
            check = check_event_log(await retried(partial(app.events, task_id, limit=10_000)))
            found = problems_of(job, check) + [f"stale {e}" for e in check.stale_events]
            if found:
                broken[task_id] = found
        logs = "".join(cluster.logs(p) for p in workers)
        report(
            "connection drops (CLIENT KILL, Redis stays up)",
            {
                "jobs": JOBS,
                "CLIENT KILL rounds (normal + pubsub)": kills,
                "wall time (s)": round(elapsed, 1),
                "final states": dict(outcomes),
                "completed jobs with a broken log/result": len(broken),
                "worker log lines 'could not store its outcome'": logs.count(
                    "could not store its outcome"
                ),
                "worker log lines 'outcome not stored'": logs.count("outcome not stored"),
            },
        )
        assert not broken, f"{len(broken)} jobs broken: {list(broken.items())[:5]}"
        assert outcomes["completed"] == JOBS, (
            f"jobs that succeeded but did not complete: {outcomes}"
        )
    finally:
        if app is not None:
            await app.close()
        if cluster is not None:
            cluster.stop_all()
        server.stop()
        left = ps_leftovers(server.pids + ([p.pid for p in cluster.procs] if cluster else []))
        assert not left, f"processes left running: {left}"
