"""rq: one job at a time per worker process; worker ``rq worker -u redis://…/8 peersbench``.

The default worker forks a work horse for every job; ``SimpleWorker`` runs jobs in the worker
process itself.
"""

from __future__ import annotations

from redis import Redis
from rq import Queue

from . import common, probe

QUEUE = "peersbench"
BATCH = 1000


def noop() -> None:
    probe.noop_sync()


def ping() -> None:
    probe.ping_sync()


def nap() -> None:
    probe.nap_sync()


FUNCTIONS = {"noop": noop, "ping": ping, "nap": nap}


class Peer(common.SyncPeer):
    name = "rq"
    dists = ("rq",)
    setup = (
        "Queue.enqueue / enqueue_many; results kept (rq's default TTL). The default Worker forks "
        "a work horse per job; SimpleWorker runs it in-process."
    )
    enqueue_modes = (common.SEQUENTIAL, f"enqueue_many, {BATCH:,} a pipeline")
    not_applicable = {"sleepers": "an rq worker runs one job at a time (one process per job)"}

    def connect(self) -> Queue:
        return Queue(QUEUE, connection=Redis.from_url(common.REDIS_URL))

    def submit(self, client: Queue, task: str) -> None:
        client.enqueue(FUNCTIONS[task])

    def submit_batch(self, client: Queue, task: str, count: int) -> None:
        for start in range(0, count, BATCH):
            size = min(BATCH, count - start)
            client.enqueue_many([Queue.prepare_data(FUNCTIONS[task]) for _ in range(size)])

    def close(self, client: Queue) -> None:
        client.connection.close()

    def workers(self, scenario: str, count: int) -> list[common.WorkerSpec]:
        argv = [common.tool("rq"), "worker", "-u", common.REDIS_URL, "-q", QUEUE]
        eager = {"BENCH_PROBE_EAGER": "1"}  # the forked child exits right after its job
        specs = [common.WorkerSpec("fork per job (default)", argv, eager)]
        if scenario == "drain":
            simple = [*argv, "-w", "rq.worker.SimpleWorker"]
            specs.append(common.WorkerSpec("SimpleWorker (no fork)", simple))
        return specs
