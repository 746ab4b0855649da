"""A Redis Cluster: a ``redis+cluster://`` backend finds the node serving its prefix's slot
from any node it is given, and follows the slot to a new primary after a failover.

Every Redis here is the test's own: three primaries sharing the slots and a replica of the
one serving the test's prefix, each on a free port, joined by CLUSTER MEET.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from backburner import Backburner, JobContext, JobStatus
from backburner.backends.redis import RedisBackend
from backburner.errors import BackendError

from ..chaos.support import RedisServer, ps_leftovers, require_redis_backend
from ..helpers import WORKER_TEST_SETTINGS, free_port, running_worker
from .test_redis_sentinel import _completed, _read, ask, enqueue_retrying, ours_on, until

PREFIX = "ha"
SLOTS = 16384


def cluster_info(port: int) -> dict[str, Any]:
    with Redis(port=port, socket_timeout=5) as client:
        return dict(client.cluster("INFO"))


def node_id(port: int) -> str:
    return str(ask(port, "CLUSTER", "MYID").decode())


def serves(port: int, slot: int) -> bool:
    """Whether the node on ``port`` is a primary that serves ``slot``."""
    for start, end, primary, *_ in ask(port, "CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return int(primary[1]) == port
    return False


@dataclass
class Cluster:
    primaries: list[RedisServer]
    replica: RedisServer
    slot: int

    @property
    def owner(self) -> RedisServer:
        """The primary that served the prefix's slot when the cluster was made."""
        return next(p for p in self.primaries if serves(p.port, self.slot))

    def others(self) -> list[RedisServer]:
        owner = self.owner
        return [p for p in self.primaries if p is not owner]

    def url(self, *servers: RedisServer) -> str:
        nodes = ",".join(f"127.0.0.1:{s.port}" for s in servers)
        return f"redis+cluster://{nodes}?prefix={PREFIX}"

    def keys_on(self, server: RedisServer) -> int:
        return len(ask(server.port, "KEYS", "{" + PREFIX + "}:*"))


BUS_PORTS: dict[Path, int] = {}
"""Each node's cluster bus port, by its directory (its port may be chosen again at start)."""


def _cluster_node(directory: Path) -> RedisServer:
    bus = free_port()  # (else its port + 10000: maybe taken, or past 65535)
    server = RedisServer(
        directory,
        appendonly=False,
        config=(
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(directory / "nodes.conf"),
            "--cluster-port",
            str(bus),
            "--cluster-node-timeout",
            "1000",
            "--repl-diskless-sync-delay",
            "0",
        ),
    )
    BUS_PORTS[directory] = bus
    return server


def _wait(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    require_redis_backend()
    primaries = [_cluster_node(tmp_path / f"primary{i}") for i in range(3)]
    replica = _cluster_node(tmp_path / "replica")
    servers = [*primaries, replica]
    try:
        for server in servers:
            server.start()
        third = SLOTS // 3
        for i, server in enumerate(primaries):
            end = SLOTS - 1 if i == 2 else (i + 1) * third - 1
            ask(server.port, "CLUSTER", "ADDSLOTSRANGE", i * third, end)
        for i, server in enumerate(servers):
            ask(server.port, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for server in servers[1:]:
            meet = ("CLUSTER", "MEET", "127.0.0.1", server.port, BUS_PORTS[server.dir])
            ask(primaries[0].port, *meet)
        _wait(
            lambda: all(cluster_info(s.port)["cluster_state"] == "ok" for s in primaries),
            "the cluster up",
        )
        slot = int(ask(primaries[0].port, "CLUSTER", "KEYSLOT", "{" + PREFIX + "}:seq"))
        made = Cluster(primaries, replica, slot)
        owner_id = node_id(made.owner.port)
        # The replica learns of its primary from the cluster bus: until then it refuses.
        _wait(lambda: _replicate(replica.port, owner_id), "the replica attached")
        _wait(lambda: _synced(replica.port), "the replica in sync")
        # A failover needs the votes of the primaries: each must know it as the owner's.
        _wait(
            lambda: all(ask(p.port, "CLUSTER", "REPLICAS", owner_id) for p in primaries),
            "every primary told of the replica",
        )
        yield made
    finally:
        for server in servers:
            server.stop()
        assert not ps_leftovers([pid for s in servers for pid in s.pids]), "a server was left"


def _replicate(port: int, primary_id: str) -> bool:
    try:
        ask(port, "CLUSTER", "REPLICATE", primary_id)
    except Exception:
        return False
    return True


def _synced(port: int) -> bool:
    with Redis(port=port, socket_timeout=5) as client:
        return client.info("replication").get("master_link_status") == "up"


def ours(port: int) -> list[dict[str, str]]:
    """Our connections on a node: not its link to its primary (flag M), once a replica."""
    return [c for c in ours_on(port) if "M" not in c["flags"]]


def _app(url: str) -> tuple[Backburner, list[str]]:
    bb = Backburner(url, settings=WORKER_TEST_SETTINGS)
    ran: list[str] = []

    @bb.task(max_attempts=1)
    async def double(ctx: JobContext, n: int) -> int:
        ran.append(ctx.job.task_id)
        return n * 2

    return bb, ran


@pytest.mark.timeout(120)
async def test_a_cluster_backend_finds_its_slot_from_any_node_and_runs_jobs(
    cluster: Cluster, tmp_path: Path
) -> None:
    other, _ = cluster.others()
    down = RedisServer(tmp_path / "never-started", appendonly=False)  # a free port: refused
    bb, ran = _app(cluster.url(down, other))  # named: a node that is down, then a non-owner

    async with bb, running_worker(bb, concurrency=4):
        jobs = [await bb.enqueue("double", {"n": n}) for n in range(20)]
        for job in jobs:
            await until(_completed(bb, job.task_id), "a job completed")
        assert sorted(ran) == sorted(j.task_id for j in jobs)
        assert ours_on(cluster.owner.port)
        assert not ours_on(other.port)  # asked once, left

    owner = cluster.owner
    assert cluster.keys_on(owner) > 0
    assert all(cluster.keys_on(p) == 0 for p in cluster.others())
    (job,) = await _read(cluster.url(other), jobs[-1].task_id)
    assert job.status is JobStatus.COMPLETED and job.result == 38


@pytest.mark.timeout(60)
async def test_a_plain_redis_url_to_a_node_of_another_slot_says_to_name_the_cluster(
    cluster: Cluster,
) -> None:
    other, _ = cluster.others()
    bb, _ = _app(f"redis://127.0.0.1:{other.port}/0?prefix={PREFIX}")
    with pytest.raises(BackendError, match=r"does not serve these keys.*redis\+cluster://"):
        await bb.connect()
    await bb.close()
    assert cluster.keys_on(other) == 0


@pytest.mark.timeout(120)
async def test_a_cluster_backend_follows_its_slot_to_a_new_primary(cluster: Cluster) -> None:
    """A planned failover loses nothing and refuses nothing: the commands the old primary
    answers MOVED (those in flight at the switch) are sent again to the new one."""
    old, new = cluster.owner, cluster.replica
    bb, ran = _app(cluster.url(*cluster.others()))
    enqueued: list[str] = []
    switched = asyncio.Event()

    async def producer() -> None:  # 16 enqueues in flight, until well past the switch
        async def lane(n: int) -> None:
            while not switched.is_set() or n < 40:
                job = await bb.enqueue("double", {"n": n})
                enqueued.append(job.task_id)
                n += 16

        await asyncio.gather(*(lane(i) for i in range(16)))

    async with bb, running_worker(bb, concurrency=50):
        before = await bb.enqueue("double", {"n": 1})
        await until(_completed(bb, before.task_id), "the first job completed")
        assert ours(old.port)  # the link's, the wake-up subscription's
        backend = bb.backend
        assert isinstance(backend, RedisBackend) and backend.eviction_policy == "noeviction"
        with Redis(port=new.port) as replica:  # the new primary may evict: read after the move
            replica.config_set("maxmemory", "1gb")
            replica.config_set("maxmemory-policy", "allkeys-lru")
        producing = asyncio.create_task(producer())
        await until(lambda: len(enqueued) >= 50, "enqueues under way")
        # A manual failover (an operator's, or a managed Redis's maintenance): the replica
        # catches up, then takes the slot; the old primary answers MOVED from then on.
        ask(new.port, "CLUSTER", "FAILOVER")
        await until(lambda: serves(new.port, cluster.slot), "the replica serving the slot")
        switched.set()
        await producing  # (an enqueue refused would raise here)
        # Every connection follows, the blocking readers too (a worker's periodic calls
        # meet the MOVED within its cancel poll).
        await until(lambda: not ours(old.port), "every connection off the old primary", 10)
        assert ours(new.port)
        for task_id in enqueued:
            await until(_completed(bb, task_id), "a job enqueued around the failover")
        idle = await bb.enqueue("double", {"n": 3})  # for a worker waiting, on the new node
        await until(_completed(bb, idle.task_id), "a job for the waiting worker")
        await until(lambda: backend.eviction_policy == "allkeys-lru", "the new node's policy")

    jobs = await _read(cluster.url(old), before.task_id, idle.task_id, *enqueued)
    assert all(job.status is JobStatus.COMPLETED for job in jobs)
    assert jobs[1].result == 6
    assert ask(new.port, "EXISTS", "{" + PREFIX + "}:j:" + idle.task_id)
    assert sorted(ran) == sorted([before.task_id, idle.task_id, *enqueued])  # each once


@pytest.mark.timeout(120)
async def test_a_cluster_backend_recovers_when_its_primary_dies(cluster: Cluster) -> None:
    old, others = cluster.owner, cluster.others()
    bb, _ = _app(cluster.url(old, *others))  # the node that dies named first

    async with bb, running_worker(bb, concurrency=4):
        before = await bb.enqueue("double", {"n": 1})
        await until(_completed(bb, before.task_id), "the first job completed")
        with Redis(port=old.port) as fence:  # (replication is asynchronous: see Sentinel's)
            fence.set("{" + PREFIX + "}:fence", "1")
            assert fence.wait(1, 10_000) == 1
        killed = time.monotonic()
        old.kill()
        after, refusals = await enqueue_retrying(bb, "double", {"n": 2})
        recovered = time.monotonic() - killed
        print(f"recovered {recovered:.2f} s after the kill ({refusals} refusals)")  # (for -s)
        await until(_completed(bb, after.task_id), "a job enqueued after the failover")

    first, second = await _read(cluster.url(*others), before.task_id, after.task_id)
    assert first.result == 2 and second.result == 4
    assert refusals > 0
    # The replica is promoted once the others count the primary failed (node timeout 1 s).
    assert 1.0 <= recovered < 20.0
