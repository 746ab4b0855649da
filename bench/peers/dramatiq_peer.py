"""dramatiq with its Redis broker; worker ``dramatiq[-gevent] peers.dramatiq_peer --processes 1``.

Under ``dramatiq-gevent`` the process is monkey-patched before this module is imported, so
``time.sleep`` in ``nap`` yields to the other greenlets.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from . import common, probe

broker = RedisBroker(url=common.REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="noop", max_retries=0)
def noop() -> None:
    probe.noop_sync()


@dramatiq.actor(actor_name="ping", max_retries=0)
def ping() -> None:
    probe.ping_sync()


@dramatiq.actor(actor_name="nap", max_retries=0)
def nap() -> None:
    probe.nap_sync()


ACTORS = {"noop": noop, "ping": ping, "nap": nap}


class Peer(common.SyncPeer):
    name = "dramatiq"
    dists = ("dramatiq", "gevent")
    setup = (
        "RedisBroker (acknowledged messages, default middleware), max_retries=0, no result "
        "backend; `--processes 1` is a supervisor and one worker process (RSS summed). An "
        "idle consumer polls with a growing back-off, so pickup grows with the idle time "
        "(here 20-50 ms between jobs)."
    )

    def connect(self) -> RedisBroker:
        return broker

    def submit(self, client: Any, task: str) -> None:
        ACTORS[task].send()

    def workers(self, scenario: str, count: int) -> list[common.WorkerSpec]:
        if scenario == "sleepers":
            label = f"gevent, threads={common.shown(scenario, count)}"
            return [_worker("dramatiq-gevent", label, count)]
        specs = [_worker("dramatiq-gevent", "gevent, threads=100", 100)]  # faster than 1,000
        if scenario == "drain":
            specs.append(_worker("dramatiq", "threads=8 (default)", 8))
        return specs


def _worker(command: str, label: str, threads: int) -> common.WorkerSpec:
    argv = [common.tool(command), "peers.dramatiq_peer", "--processes", "1"]
    return common.WorkerSpec(label, [*argv, "--threads", str(threads)])
