"""taskiq + taskiq-redis: ListQueueBroker (LPUSH/BRPOP; the fastest of its Redis brokers, with
no acknowledgements and no result backend); worker ``taskiq worker peers.taskiq_peer:broker``."""

from __future__ import annotations

from typing import Any

from taskiq_redis import ListQueueBroker

from . import common, probe

broker = ListQueueBroker(url=common.REDIS_URL, queue_name="peersbench")


@broker.task(task_name="noop")
async def noop() -> None:
    await probe.noop_async()


@broker.task(task_name="ping")
async def ping() -> None:
    await probe.ping_async()


@broker.task(task_name="nap")
async def nap() -> None:
    await probe.nap_async()


TASKS = {"noop": noop, "ping": ping, "nap": nap}


class Peer(common.AsyncPeer):
    name = "taskiq"
    dists = ("taskiq", "taskiq-redis")
    setup = (
        "ListQueueBroker (LPUSH/BRPOP: no acknowledgement, a job in flight is lost with its "
        "worker), no result backend; `taskiq worker --workers 1` is a supervisor process and "
        "one worker process (RSS summed), on uvloop (taskiq's worker takes it where installed, "
        "and backburner brings it)."
    )

    async def connect(self) -> ListQueueBroker:
        await broker.startup()
        return broker

    async def submit(self, client: Any, task: str) -> None:
        await TASKS[task].kiq()

    async def close(self, client: ListQueueBroker) -> None:
        await client.shutdown()

    def workers(self, scenario: str, count: int) -> list[common.WorkerSpec]:
        jobs = 1000 if scenario in ("drain", "pickup") else count
        argv = [common.tool("taskiq"), "worker", "peers.taskiq_peer:broker", "--workers", "1"]
        argv += ["--max-async-tasks", str(jobs), "--log-level", "WARNING"]
        return [common.WorkerSpec(f"--max-async-tasks {common.shown(scenario, jobs)}", argv)]
