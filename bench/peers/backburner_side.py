"""backburner itself; worker ``backburner worker peers.backburner_side:bb --backend URL``.

The backend is BENCH_BACKBURNER_URL (``bench/peers.py --backburner-url``; default Redis db 8).
A ``sqlite:///`` URL works too (the file is deleted before each run), to test this adapter
while the Redis backend is not there.
"""

from __future__ import annotations

import os
from pathlib import Path

from backburner import Backburner, JobContext, Settings
from backburner.backends import backend_from_url
from backburner.errors import BackburnerError

from . import common, probe


def url() -> str:
    return os.environ.get("BENCH_BACKBURNER_URL", common.REDIS_URL)


def make_app(backend_url: str) -> Backburner:
    """The benchmark's tasks, like bench/engine.py's plus the probe."""
    app = Backburner(backend_url, settings=Settings(backend_url=backend_url))

    @app.task(max_attempts=1)
    async def noop(ctx: JobContext) -> None:
        await probe.noop_async()

    @app.task(max_attempts=1)
    async def ping(ctx: JobContext) -> None:
        await probe.ping_async()

    @app.task(max_attempts=1)
    async def nap(ctx: JobContext) -> None:
        await probe.nap_async()

    return app


bb = make_app(url())


class Peer(common.AsyncPeer):
    name = "backburner"
    dists = ("backburner",)
    setup = (
        "the backend named by --backburner-url (Redis db 8 by default): durable job records, "
        "leases, events; tasks with max_attempts=1; `backburner worker --concurrency N` (on "
        "uvloop, its default where installed)."
    )

    def __init__(self) -> None:
        try:
            backend_from_url(url())
        except BackburnerError as exc:
            raise common.BenchError(f"backburner backend {url()}: {exc}") from None

    def reset(self) -> None:
        if url().startswith("sqlite:///"):
            path = url().removeprefix("sqlite:///").split("?")[0]
            for suffix in ("", "-wal", "-shm"):
                Path(path + suffix).unlink(missing_ok=True)

    async def connect(self) -> Backburner:
        app = make_app(url())
        await app.connect()
        return app

    async def submit(self, client: Backburner, task: str) -> None:
        await client.enqueue(task)

    async def close(self, client: Backburner) -> None:
        await client.close()

    def workers(self, scenario: str, count: int) -> list[common.WorkerSpec]:
        jobs = count if scenario == "sleepers" else 100
        argv = [common.tool("backburner"), "worker", "peers.backburner_side:bb"]
        argv += ["--backend", url(), "--concurrency", str(jobs), "--log-level", "warning"]
        return [common.WorkerSpec(f"concurrency={common.shown(scenario, jobs)}", argv)]
