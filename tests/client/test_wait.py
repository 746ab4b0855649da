"""wait() and poll(): spacing of the polls (fake clock), the server's hint, the timeout."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backburner.client import AsyncClient, Client
from backburner.errors import JobNotFoundError, TransportError, WaitTimeoutError
from tests.live_server import live_server

from .support import FakeClock, job_view


class Job:
    """A fake API for one job: each GET answers the next (status, Retry-After) of a script."""

    def __init__(self, clock: FakeClock, *script: tuple[str, str | None]) -> None:
        self.clock = clock
        self.script = list(script)
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.times.append(self.clock.now)
        status, hint = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        headers = {"Retry-After": hint} if hint is not None else {}
        return httpx.Response(200, json=job_view(status), headers=headers)


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


def client_for(job: Job, clock: FakeClock, **options: float) -> Client:
    transport = httpx.MockTransport(job)
    return Client("http://api.test", transport=transport, sleep=clock.sleep, clock=clock, **options)


def test_backoff_doubles_to_the_cap_without_hints() -> None:
    clock = FakeClock()
    job = Job(clock, *[("queued", None)] * 7, ("completed", None))
    with client_for(job, clock) as client:
        done = client.wait("task_abc")
    assert done.status == "completed"
    assert gaps(job.times) == [1, 2, 4, 8, 16, 30, 30]  # 1, 2, 4 ... capped at 30 s


def test_the_servers_hint_is_a_floor_under_the_backoff() -> None:
    clock = FakeClock()
    job = Job(
        clock,
        ("queued", None),  # no hint: backoff 1
        ("queued", "5"),  # the hint asks more than the backoff (2): 5
        ("processing", None),  # backoff 4
        ("processing", "1"),  # the hint asks less than the backoff (8): still 8
        ("processing", None),  # backoff 16
        ("completed", None),
    )
    with client_for(job, clock) as client:
        seen = [task.status.value for task in client.poll("task_abc")]
    assert gaps(job.times) == [1, 5, 4, 8, 16]
    assert seen == ["queued", "queued", "processing", "processing", "processing", "completed"]


def test_poll_interval_is_configurable() -> None:
    clock = FakeClock()
    job = Job(clock, *[("queued", None)] * 5, ("completed", None))
    with client_for(job, clock, poll_interval=0.01, max_poll_interval=0.05) as client:
        client.wait("task_abc")
    assert gaps(job.times) == [0.01, 0.02, 0.04, 0.05, 0.05]
    job = Job(clock, *[("queued", None)] * 3, ("completed", None))
    with client_for(job, clock) as client:
        client.wait("task_abc", poll_interval=0.5, max_poll_interval=1)
    assert gaps(job.times) == [0.5, 1, 1]
    with client_for(job, clock) as client, pytest.raises(ValueError):
        client.wait("task_abc", poll_interval=2, max_poll_interval=1)


def test_timeout_takes_a_last_look_at_the_deadline_then_raises() -> None:
    clock = FakeClock()
    job = Job(clock, ("processing", None))
    with client_for(job, clock) as client, pytest.raises(WaitTimeoutError) as raised:
        client.wait("task_abc", timeout=10)
    assert job.times == [0, 1, 3, 7, 10]  # the 8 s step is cut to the deadline
    err = raised.value
    assert (err.task_id, err.timeout, err.status) == ("task_abc", 10, "processing")
    assert isinstance(err, TimeoutError) and "after waiting 10 s" in str(err)


def test_a_terminal_job_returns_at_once() -> None:
    clock = FakeClock()
    job = Job(clock, ("cancelled", None))
    with client_for(job, clock) as client:
        assert client.wait("task_abc", timeout=0).status == "cancelled"
    assert clock.sleeps == []


async def test_async_wait_paces_the_same_way() -> None:
    clock = FakeClock()
    job = Job(clock, ("queued", "3"), ("queued", None), ("processing", None))
    transport = httpx.MockTransport(job)
    async with AsyncClient(
        "http://api.test", transport=transport, sleep=clock.asleep, clock=clock
    ) as client:
        with pytest.raises(WaitTimeoutError):
            await client.wait("task_abc", timeout=6)
    assert job.times == [0, 3, 5, 6]  # hint 3, backoff 2, then cut to the deadline


class Recording(httpx.BaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.times: list[float] = []
        self.hints: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.times.append(time.monotonic())
        response = self.inner.handle_request(request)
        self.hints.append(response.headers.get("Retry-After"))
        return response

    def close(self) -> None:
        self.inner.close()


def test_a_real_server_hint_is_honoured(tmp_path: Path) -> None:
    """The live API says Retry-After: 1 while a job runs; polls come no faster than that."""
    transport = Recording()
    with (
        live_server(tmp_path) as server,
        Client(server.url, transport=transport, poll_interval=0.01) as client,
    ):
        job = client.generate("pace me", max_tokens=60)  # ~1.3 s at 50 tokens/s
        transport.times.clear()
        transport.hints.clear()
        done = client.wait(job.task_id, timeout=30)
    assert done.status == "completed"
    assert len(transport.times) >= 2 and transport.hints[0] == "1"
    assert all(gap >= 0.99 for gap in gaps(transport.times)), gaps(transport.times)


class Restarting:
    """A job whose API goes away (connection refused, then 503s) for ``down_s`` of fake time."""

    def __init__(self, clock: FakeClock, down_from: float, down_s: float) -> None:
        self.clock, self.down_from, self.down_s = clock, down_from, down_s
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        now = self.clock.now
        self.times.append(now)
        if self.down_from <= now < self.down_from + self.down_s / 2:
            raise httpx.ConnectError("connection refused")
        if self.down_from <= now < self.down_from + self.down_s:
            return httpx.Response(
                503, json={"error": {"type": "backend_unavailable", "message": "x"}}
            )
        return httpx.Response(200, json=job_view("completed" if now > 100 else "processing"))


def test_a_wait_rides_out_an_api_restart_but_not_a_lasting_outage() -> None:
    # It gave up after 3.5 s of a routine 4 s restart, on a job of hours.
    clock = FakeClock()
    api = Restarting(clock, down_from=3, down_s=60)
    with _scripted(api, clock) as client:
        assert client.wait("task_abc").status == "completed"
    assert max(gaps(api.times)) <= 30  # it kept looking, at most max_poll_interval apart
    clock = FakeClock()
    gone = Restarting(clock, down_from=3, down_s=10_000)
    with (
        _scripted(gone, clock) as client,
        pytest.raises(TransportError, match="connection refused"),
    ):
        client.wait("task_abc")
    assert 300 <= gone.times[-1] - 3 <= 400  # about OUTAGE_S, then the last failure's error
    clock = FakeClock()
    body = {"error": {"type": "not_found", "message": "no such job"}}
    with (
        _scripted(lambda r: httpx.Response(404, json=body), clock) as client,
        pytest.raises(JobNotFoundError, match="no such job"),
    ):
        client.wait("task_abc")
    assert clock.now == 0  # not a passing failure: no waiting


def test_a_wait_through_an_outage_keeps_to_the_servers_retry_after() -> None:
    # It looked again after 1, 2, 4 ... s whatever the 503 asked.
    clock = FakeClock()
    times: list[float] = []

    def api(request: httpx.Request) -> httpx.Response:
        times.append(clock.now)
        if clock.now < 200:
            body = {"error": {"type": "backend_unavailable", "message": "maintenance"}}
            return httpx.Response(503, json=body, headers={"Retry-After": "50"})
        return httpx.Response(200, json=job_view("completed"))

    with _scripted(api, clock) as client:
        assert client.wait("task_abc").status == "completed"
    assert len(times) >= 3 and min(gaps(times)) >= 50, gaps(times)


def _scripted(answer: Any, clock: FakeClock) -> Client:
    transport = httpx.MockTransport(answer)
    return Client("http://api.test", transport=transport, sleep=clock.sleep, clock=clock)


def test_a_wait_whose_api_is_away_past_its_timeout_says_it_timed_out() -> None:
    clock = FakeClock()
    gone = Restarting(clock, down_from=2, down_s=10_000)
    with _scripted(gone, clock) as client, pytest.raises(WaitTimeoutError) as raised:
        client.wait("task_abc", timeout=20)
    assert raised.value.__cause__ is not None  # what the API did meanwhile
    assert 20 <= clock.now <= 30  # (its last look had retries of its own)
