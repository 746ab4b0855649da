"""A planned failover with three Sentinels and two replicas, under enqueues: no enqueue
acknowledged after the failover began is lost, whichever Sentinel leads it.

The Sentinel that leads a failover announces the new primary only once every replica follows it
(seconds later with two), and names the old primary until then to ``SENTINEL MASTERS``; the old
primary takes writes until it is made a replica, which discards them. A backend that listened to
the leader alone (listed first, so asked first) kept writing there: a review lost a third of the
jobs acknowledged in the failover's first 7 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backburner import Backburner, JobContext
from backburner.errors import BackburnerError

from ..chaos.support import RedisServer, _stop, ps_leftovers, require_redis_backend
from ..helpers import WORKER_TEST_SETTINGS
from .test_redis_sentinel import SERVICE, Sentinel, ask, replication, role, until


@dataclass
class Trio:
    """A primary, two replicas in sync and three Sentinels (quorum 2) watching them."""

    primary: RedisServer
    replicas: list[RedisServer]
    sentinels: list[Sentinel]

    def url(self, prefix: str) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0?prefix={prefix}"

    def agreed_primary(self) -> int | None:
        """The primary's port if every Sentinel names the same one, else None."""
        named = {s.primary_port() for s in self.sentinels}
        return named.pop() if len(named) == 1 else None


def _in_sync(port: int) -> bool:
    return replication(port).get("master_link_status") == "up"


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[Trio]:
    require_redis_backend()
    primary = RedisServer(
        tmp_path / "primary", appendonly=False, config=("--repl-diskless-sync-delay", "0")
    )
    primary.start()
    replicas = [
        RedisServer(
            tmp_path / f"replica{i}",
            appendonly=False,
            config=("--replicaof", "127.0.0.1", str(primary.port)),
        )
        for i in range(2)
    ]
    sentinels = [Sentinel(tmp_path / f"sentinel{i}", primary.port, quorum=2) for i in range(3)]
    try:
        for replica in replicas:
            replica.start()
        deadline = time.monotonic() + 30
        while not all(_in_sync(r.port) for r in replicas):
            assert time.monotonic() < deadline, "the replicas did not sync within 30 s"
            time.sleep(0.02)
        for sentinel in sentinels:
            sentinel.start()
        yield Trio(primary, replicas, sentinels)
    finally:
        for sentinel in sentinels:
            if sentinel.proc is not None:
                _stop(sentinel.proc)
        for server in (*replicas, primary):
            server.stop()
        pids = [p for server in (primary, *replicas) for p in server.pids]
        pids += [s.proc.pid for s in sentinels if s.proc is not None]
        assert not ps_leftovers(pids), "a redis-server was left running"


def _ready(trio: Trio) -> bool:
    """Every Sentinel knows both replicas and the other two Sentinels (else no failover)."""
    for sentinel in trio.sentinels:
        try:
            replicas = sentinel.ask("SENTINEL", "REPLICAS", SERVICE)
            peers = sentinel.ask("SENTINEL", "SENTINELS", SERVICE)
        except Exception:
            return False
        usable = [
            r
            for r in replicas
            if r.get(b"flags") == b"slave"
            and r.get(b"runid")
            and r.get(b"master-link-status") == b"ok"
        ]
        if len(usable) < 2 or len(peers) < 2:
            return False
    return True


@pytest.mark.timeout(150)
async def test_no_enqueue_acknowledged_during_a_failover_is_lost(trio: Trio) -> None:
    await until(lambda: _ready(trio), "the Sentinels ready for a failover", 60)
    bb = Backburner(trio.url("planned"), settings=WORKER_TEST_SETTINGS)

    @bb.task()
    async def noop(ctx: JobContext) -> None:
        pass

    acknowledged: list[tuple[float, str]] = []
    refused = 0
    stop = asyncio.Event()

    async def produce() -> None:
        nonlocal refused
        while not stop.is_set():
            try:
                job = await bb.enqueue("noop")
            except BackburnerError:  # (refused, or not known to be stored: not acknowledged)
                refused += 1
            else:
                acknowledged.append((time.monotonic(), job.task_id))
            await asyncio.sleep(0.02)  # (a steady trickle, not a flood)

    old_port = trio.primary.port
    async with bb:
        producing = asyncio.create_task(produce())
        await until(lambda: len(acknowledged) >= 20, "enqueues before the failover")
        # Asked of the Sentinel listed first: it leads the failover, and is asked first.
        began = time.monotonic()
        trio.sentinels[0].ask("SENTINEL", "FAILOVER", SERVICE)
        await until(lambda: trio.agreed_primary() not in (None, old_port), "the switch", 30)
        # The old primary takes writes until it is made a replica; then it drops them.
        await until(lambda: role(old_port) == "slave" and _in_sync(old_port), "the demotion", 60)
        after = len(acknowledged)
        await until(lambda: len(acknowledged) >= after + 20, "enqueues after the demotion")
        stop.set()
        await producing
    new_port = trio.agreed_primary()
    assert new_port is not None and new_port != old_port
    late = [task_id for at, task_id in acknowledged if at >= began + 1.0]
    assert len(late) >= 100  # (the failover took seconds: enqueues went on all along)
    lost = [t for t in late if not ask(new_port, "EXISTS", "{planned}:j:" + t)]
    assert lost == [], f"{len(lost)} of {len(late)} acknowledged enqueues lost ({refused} refused)"
