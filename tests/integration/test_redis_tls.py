"""``rediss://``: every connection the backend takes over from redis-py (its lanes, the wake-up
and hand-off channel, the event watcher) works over TLS, on a redis-server of the test's own
with certificates made for it, the client's own included (the server asks for one)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

from backburner import Backburner, JobContext, Settings
from backburner.backends.redis import RedisBackend
from backburner.errors import BackendError
from backburner.models import JobStatus

from ..chaos.support import RedisServer, started_redis, unavailable
from ..helpers import free_port, running_worker
from ._workers import registered

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_event_loops]


@dataclass(frozen=True)
class TlsRedis:
    server: RedisServer
    """Also listens without TLS, on ``server.port``: the test's own look at the keys."""
    tls_port: int
    ca: Path
    """The server's self-signed certificate, the CA a client must trust."""
    client: tuple[Path, Path]
    """A client certificate the server trusts, and its key."""

    def url(self, ca: Path | None = None, *, client: bool = True) -> str:
        query = f"ssl_ca_certs={ca or self.ca}&prefix=tls-{uuid.uuid4().hex[:12]}"
        if client:
            query += f"&ssl_certfile={self.client[0]}&ssl_keyfile={self.client[1]}"
        return f"rediss://127.0.0.1:{self.tls_port}/0?{query}"


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("the openssl command is not installed")
        raise AssertionError  # (unreachable: unavailable skips or fails)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            # (Python 3.13's strict checks want a CA's key usage said)
            *("-addext", "keyUsage=critical,digitalSignature,keyCertSign"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    cert, key = self_signed(tmp_path, "server")
    client = self_signed(tmp_path, "client")
    trusted = tmp_path / "trusted.pem"  # (whom the server trusts: itself and the client)
    trusted.write_text(cert.read_text() + client[0].read_text())
    tls_port = free_port()
    server = started_redis(
        tmp_path,
        *("--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)),
        *("--tls-ca-cert-file", str(trusted), "--tls-auth-clients", "yes"),
    )
    yield TlsRedis(next(server), tls_port, cert, client)
    server.close()


async def test_jobs_their_hand_off_and_their_events_go_over_tls(tls_redis: TlsRedis) -> None:
    url = tls_redis.url()
    bb = Backburner(url, settings=Settings(backend_url=url, idle_wait_s=5.0))
    gate = asyncio.Event()

    @bb.task(max_attempts=1)
    async def halve(ctx: JobContext, x: int) -> int:
        await ctx.progress(50, "half way")
        await gate.wait()
        return x // 2

    plain = Redis(port=tls_redis.server.port)
    try:
        async with bb, running_worker(bb, concurrency=2) as worker:
            backend = bb.backend
            assert isinstance(backend, RedisBackend)
            await registered(plain, backend, worker.worker_id)  # (registered over TLS)
            job = await bb.enqueue("halve", {"x": 84})

            async def reported() -> int:
                while True:
                    events = await bb.events(job.task_id)
                    if any(event.type == "progress" for event in events):
                        return events[-1].seq
                    await asyncio.sleep(0.01)

            seen = await asyncio.wait_for(reported(), 10)
            # The event watcher reads the job's stream over TLS (blocking, unless the result
            # is there before it looks) until the result comes.
            watching = asyncio.create_task(backend.wait_for_events({job.task_id: seen}, timeout=10))
            gate.set()
            heads = await asyncio.wait_for(watching, 15)
            assert heads.get(job.task_id, 0) > seen
            done = await bb.wait(job.task_id, timeout=10)
            assert done.status == JobStatus.COMPLETED and done.result == 42
            assert [record.worker_id for record in done.history] == [worker.worker_id]
            assert await plain.exists("{" + backend.prefix + "}:j:" + job.task_id)
    finally:
        gate.set()
        await plain.aclose()


async def refusal(url: str) -> str:
    """The message of the BackendError that connecting to ``url`` raises."""
    bb = Backburner(url)
    try:
        with pytest.raises(BackendError) as refused:
            await asyncio.wait_for(bb.connect(), 20)
    finally:
        await bb.close()
    return str(refused.value)


async def test_a_certificate_nobody_vouched_for_is_refused_in_one_clear_line(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    other, _ = self_signed(tmp_path, "other")
    message = await refusal(tls_redis.url(other))
    assert "\n" not in message
    assert f"127.0.0.1:{tls_redis.tls_port}" in message
    assert "CERTIFICATE_VERIFY_FAILED" in message


async def test_a_client_without_a_certificate_is_refused_clearly(tls_redis: TlsRedis) -> None:
    message = await refusal(tls_redis.url(client=False))
    assert "\n" not in message
    assert message.startswith(f"cannot connect to Redis at 127.0.0.1:{tls_redis.tls_port}: ")
    assert message.endswith("give ssl_certfile and ssl_keyfile in the URL.")


async def test_a_plain_url_for_a_tls_port_says_rediss(tls_redis: TlsRedis) -> None:
    refused = await refusal(f"redis://127.0.0.1:{tls_redis.tls_port}/0")
    assert refused.endswith("the URL is rediss://, not redis://.")


async def test_a_tls_url_for_a_plain_port_says_redis(tls_redis: TlsRedis) -> None:
    plain = f"rediss://127.0.0.1:{tls_redis.server.port}/0?socket_connect_timeout=0.5"
    refused = await refusal(plain + f"&ssl_ca_certs={tls_redis.ca}")
    assert refused.endswith("the URL is redis://, not rediss://.")
