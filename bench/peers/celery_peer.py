"""celery with Redis as broker and result backend; worker ``celery -A peers.celery_peer worker``.

With ``-P gevent`` celery monkey-patches the process before importing this module, so
``time.sleep`` in ``nap`` yields to the other greenlets.
"""

from __future__ import annotations

import time

from celery import Celery

from . import common, probe

app = Celery("peersbench", broker=common.REDIS_URL, backend=common.REDIS_URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    result_expires=3600,
)


@app.task(name="noop")
def noop() -> None:
    probe.noop_sync()


@app.task(name="ping")
def ping() -> None:
    probe.ping_sync()


@app.task(name="nap")
def nap() -> None:
    probe.nap_sync()


TASKS = {"noop": noop, "ping": ping, "nap": nap}
DELAY = "delay()"
IGNORE_RESULT = "delay(), ignore_result=True"


class Peer(common.SyncPeer):
    name = "celery"
    dists = ("celery", "kombu", "gevent")
    setup = (
        "Redis broker and result backend; delay() subscribes the producer to each job's result "
        "channel (celery's default with a Redis backend); prefork -c 2 is a master and two "
        "children (RSS summed)."
    )
    enqueue_modes = (DELAY, IGNORE_RESULT)

    def connect(self) -> Celery:
        return app

    def submit(self, client: Celery, task: str) -> None:
        TASKS[task].delay()

    def close(self, client: Celery) -> None:
        """Drop the result subscriptions ``delay()`` made (one per job, celery's default)."""
        consumer = client.backend.result_consumer
        consumer.stop()
        consumer.subscribed_to.clear()

    def enqueue(self, mode: str, count: int) -> float:
        options = {"ignore_result": True} if mode == IGNORE_RESULT else {}
        try:
            start = time.perf_counter()
            for _ in range(count):
                noop.apply_async(**options)
            return count / (time.perf_counter() - start)
        finally:
            self.close(app)

    def fill(self, task: str, count: int) -> None:
        try:
            for _ in range(count):
                self.submit(app, task)
        finally:
            self.close(app)

    def workers(self, scenario: str, count: int) -> list[common.WorkerSpec]:
        if scenario == "sleepers":
            return [_worker(f"gevent -c {common.shown(scenario, count)}", "gevent", count)]
        specs = [_worker("prefork -c 2", "prefork", 2)]
        if scenario == "drain":
            specs.append(_worker("gevent -c 1000", "gevent", 1000))
        return specs


def _worker(label: str, pool: str, processes: int) -> common.WorkerSpec:
    argv = [common.tool("celery"), "-A", "peers.celery_peer", "worker", "-P", pool]
    argv += ["-c", str(processes), "-l", "WARNING"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return common.WorkerSpec(label, argv)
