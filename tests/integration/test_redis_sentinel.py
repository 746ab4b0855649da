"""High availability: a ``redis+sentinel://`` backend finds the primary its Sentinels name and
follows a failover without a restart; a primary turned replica under a connection is left.

Every Redis here is the test's own (a primary, its replica and one Sentinel, on free ports).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from backburner import Backburner, Job, JobContext, JobStatus
from backburner.backends import backend_from_url
from backburner.backends.redis import RedisBackend
from backburner.backends.redis_endpoint import SENTINEL_TIMEOUT_S
from backburner.errors import BackendError, NotPrimaryError, NotReplicatedError

from ..chaos.support import RedisServer, _stop, ps_leftovers, require_redis_backend
from ..helpers import WORKER_TEST_SETTINGS, eventually, free_port, running_worker
from .conftest import noop_app

SERVICE = "bbtest"


class Sentinel:
    """One redis-server in Sentinel mode, on a free port, watching ``primary``."""

    def __init__(self, directory: Path, primary_port: int, quorum: int = 1) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config = directory / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        self.log = directory / "sentinel.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", str(self.config), "--sentinel", "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def ask(self, *command: str) -> Any:
        return ask(self.port, *command)

    def primary_port(self) -> int | None:
        try:
            address = self.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        except (OSError, ConnectionError, Exception):
            return None
        return int(address[1]) if address else None

    def replica_ready(self) -> bool:
        """Whether the Sentinel would promote a replica: one it has read INFO from (so knows
        its run id), connected, in sync with the primary (else NOGOODSLAVE)."""
        try:
            replicas = self.ask("SENTINEL", "REPLICAS", SERVICE)
        except Exception:
            return False
        for replica in replicas:  # (redis-py makes each a dict of bytes)
            if (
                replica.get(b"flags") == b"slave"
                and replica.get(b"runid")
                and replica.get(b"master-link-status") == b"ok"
            ):
                return True
        return False


@dataclass
class SentinelSet:
    primary: RedisServer
    replica: RedisServer
    sentinel: Sentinel

    def url(self, prefix: str) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{SERVICE}/0?prefix={prefix}"


def ask(port: int, *command: str | int) -> Any:
    """One command to a Redis of this test, on a connection of its own, closed after."""
    with Redis(port=port, socket_timeout=5) as client:
        return client.execute_command(*command)


def role(port: int) -> str:
    return str(replication(port)["role"])


def replication(port: int) -> dict[str, Any]:
    with Redis(port=port, socket_timeout=5) as client:
        return dict(client.info("replication"))


async def until(check: object, message: str, timeout: float = 30.0) -> float:
    """Seconds until ``check`` holds (AssertionError past ``timeout``)."""
    return await eventually(check, timeout=timeout, interval=0.01, message=message)  # type: ignore[arg-type]


def ours_on(port: int) -> list[dict[str, str]]:
    """The connections of this test's backends on a Redis: neither Sentinel's (named), nor the
    replication link (flag S), nor this look (CLIENT LIST)."""
    with Redis(port=port, socket_timeout=5) as client:
        clients = client.client_list()
    return [
        c for c in clients if not c["name"] and "S" not in c["flags"] and c["cmd"] != "client|list"
    ]


def _synced(replica_port: int) -> bool:
    return replication(replica_port).get("master_link_status") == "up"


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    """A primary, its replica (in sync) and a Sentinel watching them: a Sentinel learns of
    replicas from the primary's INFO, which it reads at once and then every 10 s."""
    require_redis_backend()
    primary = RedisServer(
        tmp_path / "primary", appendonly=False, config=("--repl-diskless-sync-delay", "0")
    )
    primary.start()
    replica = RedisServer(
        tmp_path / "replica",
        appendonly=False,
        config=("--replicaof", "127.0.0.1", str(primary.port)),
    )
    sentinel = Sentinel(tmp_path / "sentinel", primary.port)
    try:
        replica.start()
        deadline = time.monotonic() + 30
        while not _synced(replica.port):
            assert time.monotonic() < deadline, "the replica did not sync within 30 s"
            time.sleep(0.02)
        sentinel.start()
        yield SentinelSet(primary, replica, sentinel)
    finally:
        if sentinel.proc is not None:
            _stop(sentinel.proc)
        replica.stop()
        primary.stop()
        pids = [*primary.pids, *replica.pids, *([sentinel.proc.pid] if sentinel.proc else [])]
        assert not ps_leftovers(pids), "a redis-server was left running"


@pytest.mark.timeout(120)
async def test_a_sentinel_backend_follows_a_failover(
    sentinel_set: SentinelSet, caplog: pytest.LogCaptureFixture
) -> None:
    await until(sentinel_set.sentinel.replica_ready, "the Sentinel ready to promote the replica")
    bb = Backburner(sentinel_set.url("ha"), settings=WORKER_TEST_SETTINGS)
    caplog.set_level(logging.WARNING, logger="backburner.redis")
    ran: list[str] = []

    @bb.task(max_attempts=1)
    async def note(ctx: JobContext, n: int) -> int:
        ran.append(ctx.job.task_id)
        return n * 2

    async with bb, running_worker(bb, concurrency=4):
        before = await bb.enqueue("note", {"n": 1})
        await until(lambda: before.task_id in ran, "the first job run")
        await until(_completed(bb, before.task_id), "the first job completed")

        old_port, new_port = sentinel_set.primary.port, sentinel_set.replica.port
        assert ours_on(old_port)  # the link's, the wake-up subscription's
        # Replication is asynchronous: what the replica lacks at the failover is lost (as
        # with any Redis client). An operator's planned failover first waits for it; so do we.
        with Redis(port=old_port) as fence:
            fence.set("fence", "1")
            assert fence.wait(1, 10_000) == 1
        backend = bb.backend
        assert isinstance(backend, RedisBackend) and backend.eviction_policy == "noeviction"
        with Redis(port=new_port) as replica:  # the new primary may evict: read after the switch
            replica.config_set("maxmemory", "1gb")
            replica.config_set("maxmemory-policy", "allkeys-lru")
        sentinel_set.sentinel.ask("SENTINEL", "FAILOVER", SERVICE)
        await until(lambda: sentinel_set.sentinel.primary_port() == new_port, "the switch")
        # The old primary is up and takes writes until Sentinel makes it a replica, ~10 s
        # later: the backend leaves it when the switch is announced, not then.
        await until(lambda: not ours_on(old_port), "every connection off the old primary", 8)
        assert role(old_port) == "master"

        after = await bb.enqueue("note", {"n": 2})
        await until(_completed(bb, after.task_id), "a job enqueued after the failover completed")
        await until(lambda: backend.eviction_policy == "allkeys-lru", "the new primary's policy")
        assert any(
            "maxmemory-policy allkeys-lru" in r.getMessage()
            for r in caplog.records
            if r.name == "backburner.redis" and r.levelno == logging.WARNING
        )

    first, second = await _read(sentinel_set.url("ha"), before.task_id, after.task_id)
    assert first.status is JobStatus.COMPLETED and first.result == 2  # replicated before
    assert second.status is JobStatus.COMPLETED and second.result == 4
    assert ask(new_port, "EXISTS", "{ha}:j:" + after.task_id)  # on the new primary
    assert ran.count(before.task_id) == 1 and ran.count(after.task_id) == 1


@pytest.mark.timeout(120)
async def test_a_sentinel_backend_recovers_when_its_primary_dies(sentinel_set: SentinelSet) -> None:
    await until(sentinel_set.sentinel.replica_ready, "the Sentinel ready to promote the replica")
    bb = Backburner(sentinel_set.url("dies"), settings=WORKER_TEST_SETTINGS)

    @bb.task(max_attempts=1)
    async def double(ctx: JobContext, n: int) -> int:
        return n * 2

    async with bb, running_worker(bb, concurrency=4):
        before = await bb.enqueue("double", {"n": 1})
        await until(_completed(bb, before.task_id), "the first job completed")
        with Redis(port=sentinel_set.primary.port) as fence:
            fence.set("fence", "1")
            assert fence.wait(1, 10_000) == 1
        killed = time.monotonic()
        sentinel_set.primary.kill()
        after, refusals = await enqueue_retrying(bb, "double", {"n": 2})
        recovered = time.monotonic() - killed
        await until(_completed(bb, after.task_id), "a job enqueued after the failover completed")

    first, second = await _read(sentinel_set.url("dies"), before.task_id, after.task_id)
    assert first.result == 2 and second.result == 4
    assert refusals > 0  # it was refused while no primary answered, not queued somewhere
    # Sentinel waits down-after-milliseconds (1 s here) before it fails over.
    assert 1.0 <= recovered < 20.0


async def enqueue_retrying(bb: Backburner, task: str, payload: dict[str, Any]) -> tuple[Job, int]:
    """What a client does while no primary answers: its enqueue fails, it retries every 50 ms
    (for up to 30 s). The job, and how many times it was refused."""
    started, refusals = time.monotonic(), 0
    while True:
        try:
            return await bb.enqueue(task, payload), refusals
        except BackendError:
            refusals += 1
            assert time.monotonic() - started < 30, "no primary within 30 s"
            await asyncio.sleep(0.05)


def _completed(bb: Backburner, task_id: str) -> object:
    async def check() -> bool:
        job = await bb.get(task_id)
        return job is not None and job.status is JobStatus.COMPLETED

    return check


async def _read(url: str, *task_ids: str) -> list[Job]:
    """The jobs, read by a client of its own. Its first connection asks the Sentinel for the
    primary, which it may not name for a moment after a failover (seen once, with the whole
    suite loading both cores: "No master found"): it tries again, as a client would, for up
    to 30 s."""
    started = time.monotonic()
    while True:
        try:
            async with Backburner(url) as reader:
                return [await reader.get(task_id) for task_id in task_ids]
        except BackendError:
            assert time.monotonic() - started < 30, "no primary named within 30 s"
            await asyncio.sleep(0.05)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
async def test_a_primary_made_replica_under_a_connection_refuses_with_not_primary(
    tmp_path: Path, functions: bool
) -> None:
    """Its connections stay open (Redis does not close them), and each write gets READONLY:
    the link drops that connection and every one it opened before (they talk to the same
    Redis) and sends the command once more, on a new one; with the same address that is
    refused again, so the caller gets NotPrimaryError and nothing is written. Made a primary
    again, the same backend writes."""
    require_redis_backend()
    target = RedisServer(tmp_path / "target", appendonly=False)
    target.start()
    try:
        url = target.url("demoted")
        backend = RedisBackend(url.partition("?")[0], prefix="demoted", functions=functions)
        bb = Backburner(backend, settings=WORKER_TEST_SETTINGS)

        @bb.task()
        async def noop(ctx: JobContext) -> None:
            pass

        async with bb:
            first = await bb.enqueue("noop")
            # Enough reads at once that the link opens its second connection too.
            await asyncio.gather(*(bb.get(first.task_id) for _ in range(50)))
            links = {c["id"] for c in ours_on(target.port)}
            assert len(links) == 2
            # A replica of a primary that never answers (a port bound, not listening, for the
            # test's length): read-only, and it keeps its data.
            with socket.socket() as nowhere:
                nowhere.bind(("127.0.0.1", 0))
                ask(target.port, "REPLICAOF", "127.0.0.1", nowhere.getsockname()[1])
                with pytest.raises(NotPrimaryError, match="replica"):
                    await bb.enqueue("noop")
                # Enqueues at once go as one batch (by EVALSHA, each refused in its place).
                refused = await asyncio.gather(
                    *(bb.enqueue("noop") for _ in range(5)), return_exceptions=True
                )
                assert all(isinstance(r, NotPrimaryError) for r in refused), refused
                keys = ask(target.port, "KEYS", "{demoted}:j:*")
                assert keys == [b"{demoted}:j:" + first.task_id.encode()]
                ask(target.port, "REPLICAOF", "NO", "ONE")
            job = await bb.enqueue("noop")
            assert job.status is JobStatus.QUEUED
            assert ask(target.port, "EXISTS", "{demoted}:j:" + job.task_id)
            still = {c["id"] for c in ours_on(target.port)}
            assert not links & still  # dropped, not kept
    finally:
        target.stop()


async def test_a_sentinel_url_is_read_at_once_and_its_service_named_when_unreachable() -> None:
    backend = backend_from_url("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/3?prefix=p")
    assert backend.prefix == "p"  # type: ignore[attr-defined]
    with socket.socket() as nowhere:  # bound, not listening: connect() names the service
        nowhere.bind(("127.0.0.1", 0))
        bad = backend_from_url(f"redis+sentinel://127.0.0.1:{nowhere.getsockname()[1]}/svc")
        with pytest.raises(BackendError, match="Sentinel service 'svc'") as refused:
            await bad.connect()
        await bad.close()
    # One line naming the Sentinel and why, not redis-py's reprs of its clients (2.4 KB).
    message = str(refused.value)
    assert "Error 111" in message and "<redis" not in message and len(message) < 400


@pytest.mark.timeout(60)
async def test_a_hung_sentinel_listed_first_delays_a_connect_by_its_timeout_only(
    sentinel_set: SentinelSet,
) -> None:
    with socket.socket() as hung:  # listening, never read: the kernel accepts, nobody answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        sentinels = f"127.0.0.1:{hung.getsockname()[1]},127.0.0.1:{sentinel_set.sentinel.port}"
        bb = noop_app(f"redis+sentinel://{sentinels}/{SERVICE}/0?prefix=hung")
        started = time.monotonic()
        async with bb:
            job = await bb.enqueue("noop")
            took = time.monotonic() - started
            assert (await bb.get(job.task_id)).status is JobStatus.QUEUED
    # The hung one was asked first, and given up after SENTINEL_TIMEOUT_S (it was 5 s: the
    # primary's timeout).
    assert SENTINEL_TIMEOUT_S - 0.1 <= took < SENTINEL_TIMEOUT_S + 2.0


def _streaming(primary_port: int) -> bool:
    """Whether the primary streams its writes to its replica: after a diskless sync it waits
    for the replica's first acknowledgement (sent within a second), and until then WAIT gets
    no answer from it. An acknowledged offset says it came."""
    replica = replication(primary_port).get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online" and replica["offset"] > 0


def replicated_app(port: int, prefix: str, timeout_ms: int) -> Backburner:
    url = f"redis://127.0.0.1:{port}/0?prefix={prefix}&replicas=1&replica_timeout_ms={timeout_ms}"
    bb = Backburner(url, settings=WORKER_TEST_SETTINGS)

    @bb.task()
    async def noop(ctx: JobContext) -> None:
        pass

    return bb


@pytest.mark.timeout(60)
async def test_with_replicas_1_an_enqueue_is_acknowledged_once_the_replica_has_it(
    sentinel_set: SentinelSet,
) -> None:
    primary, replica = sentinel_set.primary, sentinel_set.replica
    assert replica.proc is not None
    await until(lambda: _streaming(primary.port), "the primary streaming to its replica")
    # (A generous wait where the replica answers, a short one where it cannot.)
    async with replicated_app(primary.port, "waits", 4000) as bb:
        first = await bb.enqueue("noop")
        assert ask(replica.port, "EXISTS", "{waits}:j:" + first.task_id)
    os.kill(replica.proc.pid, signal.SIGSTOP)  # a replica that confirms nothing
    try:
        async with replicated_app(primary.port, "waits", 300) as impatient:
            started = time.monotonic()
            with pytest.raises(NotReplicatedError, match="0 of the 1 replicas"):
                await impatient.enqueue("noop", idempotency_key="k1")
            waited = time.monotonic() - started
        # The same enqueue repeated by another process (another connection, which wrote
        # nothing yet): it is a repeat, and still not acknowledged before the replica has it.
        async with replicated_app(primary.port, "waits", 300) as other:
            with pytest.raises(NotReplicatedError):
                await other.enqueue("noop", idempotency_key="k1")
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert 0.3 <= waited < 5.0
    async with replicated_app(primary.port, "waits", 4000) as bb:
        again = await bb.enqueue("noop", idempotency_key="k1")
        assert ask(replica.port, "EXISTS", "{waits}:j:" + again.task_id)
        later = await bb.enqueue("noop")
        assert ask(replica.port, "EXISTS", "{waits}:j:" + later.task_id)


@pytest.mark.timeout(120)
async def test_with_replicas_1_no_acknowledged_enqueue_is_lost_when_the_primary_dies(
    sentinel_set: SentinelSet,
) -> None:
    """Enqueues in flight, batched; the primary is killed the moment the last is answered:
    the replica Sentinel promotes has every one of them."""
    await until(sentinel_set.sentinel.replica_ready, "the Sentinel ready to promote the replica")
    await until(lambda: _streaming(sentinel_set.primary.port), "the primary streaming")
    url = sentinel_set.url("kept") + "&replicas=1&replica_timeout_ms=4000"
    bb = Backburner(url, settings=WORKER_TEST_SETTINGS)

    @bb.task()
    async def noop(ctx: JobContext) -> None:
        pass

    async with bb:
        jobs = await asyncio.gather(*(bb.enqueue("noop") for _ in range(300)))
        sentinel_set.primary.kill()
    new_port = sentinel_set.replica.port
    await until(lambda: sentinel_set.sentinel.primary_port() == new_port, "the failover", 30)
    missing = [j.task_id for j in jobs if not ask(new_port, "EXISTS", "{kept}:j:" + j.task_id)]
    assert missing == []
    assert len({job.task_id for job in jobs}) == 300


async def test_a_primary_with_fewer_replicas_than_replicas_n_is_reported_at_connect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require_redis_backend()
    alone = RedisServer(tmp_path / "alone", appendonly=False)
    alone.start()
    try:
        caplog.set_level(logging.WARNING, logger="backburner.redis")
        async with replicated_app(alone.port, "fewer", 300) as bb:
            with pytest.raises(NotReplicatedError):  # (what the warning foretells)
                await bb.enqueue("noop")
    finally:
        alone.stop()
    warned = [r.getMessage() for r in caplog.records if r.name == "backburner.redis"]
    assert any("has 0 replicas connected, and replicas=1" in m for m in warned), warned
