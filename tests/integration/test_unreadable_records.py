"""A stored job that no reader can read back costs that job, never a worker or a listing.

Each test damages one job's record behind the backend's back (as a hand edit, a disk or a
release that stores what this one cannot read would), on SQLite and on Redis.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from backburner import Backburner, JobContext
from backburner.backends import Backend
from backburner.backends.redis import RedisBackend
from backburner.backends.sqlite import SQLiteBackend
from backburner.errors import CorruptRecordError
from backburner.models import JobStatus
from backburner.webhooks.dispatcher import webhook_body
from backburner.worker.sweeper import sweep_once

from ..conformance._support import new_job, opened
from ..conftest import REDIS_TEST_URL
from ..helpers import WORKER_TEST_SETTINGS, abandoned_job, eventually, running_worker


@pytest.fixture(params=["sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with opened(str(request.param), tmp_path) as engine:
        yield engine


async def damage(store: Backend, task_id: str) -> None:
    """Make the job's record unreadable: a lone surrogate's escape in its metadata (SQLite),
    a priority that is no number (Redis)."""
    if isinstance(store, SQLiteBackend):
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "UPDATE jobs SET metadata = ? WHERE task_id = ?", ('{"a":"\\ud800"}', task_id)
            )
        return
    assert isinstance(store, RedisBackend)
    client = aioredis.Redis.from_url(REDIS_TEST_URL)
    try:
        assert await client.hset(f"{{{store.prefix}}}:j:{task_id}", "priority", '"high"') == 0
    finally:
        await client.aclose()


async def stored_state(store: Backend, task_id: str) -> tuple[str, dict[str, object] | None]:
    """The job's status and error as stored, read past the part that cannot be read."""
    if isinstance(store, SQLiteBackend):
        with sqlite3.connect(store.path) as conn:
            status, error = conn.execute(
                "SELECT status, error FROM jobs WHERE task_id = ?", (task_id,)
            ).fetchone()
        return status, None if error is None else json.loads(error)
    assert isinstance(store, RedisBackend)
    client = aioredis.Redis.from_url(REDIS_TEST_URL)
    try:
        status, error = await client.hmget(f"{{{store.prefix}}}:j:{task_id}", "status", "error")
    finally:
        await client.aclose()
    return json.loads(status), None if error is None else json.loads(error)


async def test_a_worker_fails_an_unreadable_job_and_runs_the_others(store: Backend) -> None:
    # A lease far longer than the test: no sweeper fails the job, only the claim that met it.
    bb = Backburner(store, settings=WORKER_TEST_SETTINGS.replace(lease_s=600.0))
    ran: list[int] = []

    @bb.task(max_attempts=3)
    async def echo(ctx: JobContext, n: int) -> int:
        ran.append(n)
        return n

    bad = await bb.enqueue("echo", {"n": 0})
    good = [await bb.enqueue("echo", {"n": n}) for n in range(1, 6)]
    await damage(store, bad.task_id)
    async with running_worker(bb, concurrency=4) as worker:
        for job in good:
            done = await bb.wait(job.task_id, timeout=20)
            assert done.status == JobStatus.COMPLETED
        await eventually(
            lambda: _is_failed(store, bad.task_id), message="the unreadable job failed"
        )
        assert worker.started.is_set() and not worker.running
    assert sorted(ran) == [1, 2, 3, 4, 5]  # never the damaged one
    status, error = await stored_state(store, bad.task_id)
    assert status == "failed"
    assert error is not None and error["type"] == "corrupt_record"
    assert error["retryable"] is False
    assert "cannot be read" in str(error["message"])


async def _is_failed(store: Backend, task_id: str) -> bool:
    return (await stored_state(store, task_id))[0] == "failed"


async def test_reads_name_the_unreadable_job_and_listings_leave_it_out(store: Backend) -> None:
    bad, _ = await store.enqueue(new_job("t", now=1.0))
    good, _ = await store.enqueue(new_job("t", now=2.0))
    await damage(store, bad.task_id)
    with pytest.raises(CorruptRecordError) as caught:
        await store.get(bad.task_id)
    assert caught.value.task_id == bad.task_id
    assert str(caught.value).startswith(f"job {bad.task_id}: its stored record cannot be read (")
    for page in (
        await store.list_jobs(limit=10),
        await store.list_jobs(limit=10, type="t"),
        await store.list_jobs(limit=10, status=JobStatus.QUEUED),
        await store.list_jobs(limit=10, tenant="default", status=JobStatus.QUEUED),
    ):
        assert [job.task_id for job in page.jobs] == [good.task_id]


async def test_a_sweeper_fails_an_unreadable_job_whose_lease_ended(store: Backend) -> None:
    bb, clock, job = await abandoned_job(store, WORKER_TEST_SETTINGS, max_attempts=3, lease_s=5.0)
    await damage(store, job.task_id)
    clock.advance(10.0)
    report = await sweep_once(bb)
    assert (report.requeued, report.failed) == (0, 0)  # not retried as a lease that ran out
    status, error = await stored_state(store, job.task_id)
    assert status == "failed" and error is not None and error["type"] == "corrupt_record"
    assert await store.expired_leases(now=clock.now() + 100, limit=10) == []


async def test_the_webhook_of_an_unreadable_job_says_it_failed(store: Backend) -> None:
    job, _ = await store.enqueue(new_job("t", now=1.0, webhook_url="https://hooks.example.com/in"))
    await damage(store, job.task_id)
    assert await store.claim("w", limit=1, now=2.0, lease_s=30.0) == []  # failed, not run
    assert (await stored_state(store, job.task_id))[0] == "failed"
    [message] = await store.claim_webhooks(now=4.0, limit=10, lease_s=30.0)
    assert (message.task_id, message.event) == (job.task_id, "task.failed")
    body = json.loads(webhook_body(message, None))
    assert body == {"type": "task.failed", "task_id": job.task_id, "status": "failed"}


async def test_a_sweeper_fails_an_unreadable_job_only_once_its_lease_ended(
    store: Backend,
) -> None:
    job, _ = await store.enqueue(new_job("t", now=990.0))
    await store.claim("w", limit=1, now=995.9, lease_s=5.0)  # its lease ends at 1000.9
    await damage(store, job.task_id)
    # (Redis reads every lease of the second 1000, ended or not.)
    assert await store.expired_leases(now=1000.2, limit=10) == []
    assert (await stored_state(store, job.task_id))[0] == "processing"
    assert await store.expired_leases(now=1001.0, limit=10) == []
    status, error = await stored_state(store, job.task_id)
    assert status == "failed" and error is not None and error["type"] == "corrupt_record"


async def test_a_job_handed_to_a_redis_worker_unreadable_is_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with opened("redis", tmp_path) as store:
        assert isinstance(store, RedisBackend)
        bb = Backburner(store, settings=WORKER_TEST_SETTINGS.replace(lease_s=600.0))

        @bb.task
        async def t(ctx: JobContext) -> None:
            raise AssertionError("an unreadable job must not run")

        async with running_worker(bb, concurrency=2) as worker:
            # A job claimed for the idle worker and published to it, as an enqueue's hand-off
            # does, but damaged on the way: due in an hour, so nobody else claims it.
            later = time.time() + 3600
            job, _ = await store.enqueue(new_job("t", now=time.time(), run_at=later))
            [held] = await store.claim(worker.worker_id, limit=1, now=later, lease_s=600.0)
            assert held.task_id == job.task_id
            await damage(store, job.task_id)
            [document] = await store._run("read_jobs", job.task_id)
            client = aioredis.Redis.from_url(REDIS_TEST_URL)
            try:
                channel = f"{{{store.prefix}}}:hand:{worker.worker_id}"
                await eventually(lambda: _subscribed(client, channel), message="its hand-off")
                assert await client.publish(channel, document) == 1
            finally:
                await client.aclose()
            await eventually(lambda: _is_failed(store, job.task_id), message="the handed job")
            assert not worker.running
    # Failed as it arrived, not left for a later wait by a delivery that broke.
    assert not [r for r in caplog.records if "could not be delivered" in r.getMessage()]


async def _subscribed(client: aioredis.Redis, channel: str) -> bool:
    return dict(await client.pubsub_numsub(channel)).get(channel.encode(), 0) > 0


async def test_a_job_damaged_while_it_runs_settles_and_then_fails(
    store: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    bb = Backburner(store, settings=WORKER_TEST_SETTINGS)
    started, go_on = asyncio.Event(), asyncio.Event()

    @bb.task(max_attempts=3)
    async def flaky(ctx: JobContext) -> None:
        started.set()
        await go_on.wait()
        raise RuntimeError("the attempt fails: a retry, whose write reads the job back")

    @bb.task
    async def later(ctx: JobContext) -> str:
        return "ran"

    job = await bb.enqueue("flaky")
    async with running_worker(bb, concurrency=1):
        await asyncio.wait_for(started.wait(), 20)
        await damage(store, job.task_id)
        go_on.set()
        await eventually(lambda: _is_failed(store, job.task_id), message="the damaged job failed")
        after = await bb.wait((await bb.enqueue("later")).task_id, timeout=20)
    assert after.result == "ran"  # the worker went on
    # Its retry was written (the read back failed): settled at once, not retried as unwritten.
    stored = [r.getMessage() for r in caplog.records if "outcome stored, but" in r.getMessage()]
    assert len(stored) == 1, stored
    assert stored[0].startswith(f"job {job.task_id}: outcome stored, but its stored record cannot")
    status, error = await stored_state(store, job.task_id)
    assert status == "failed" and error is not None and error["type"] == "corrupt_record"


@pytest.mark.parametrize(
    ("column", "damaged", "reason"),
    [
        ("input", "'{'", "input: not JSON"),
        ("metadata", "CAST(X'7B2261223A22FF227D' AS TEXT)", "Invalid JSON"),  # not UTF-8
        ("history", "'['", "history: not JSON"),
        ("result", "'nope'", "result: not JSON"),
    ],
)
async def test_sqlite_text_that_is_no_json_or_no_utf8_costs_its_job_alone(
    tmp_path: Path, column: str, damaged: str, reason: str
) -> None:
    # SQLite's own JSON functions and sqlite3's decoding would fail the whole statement: the
    # claim, the listing, the sweep of every job, not just this one's.
    async with opened("sqlite", tmp_path) as store:
        assert isinstance(store, SQLiteBackend)
        bad, _ = await store.enqueue(new_job("t", now=1.0))
        good, _ = await store.enqueue(new_job("t", now=2.0))
        with sqlite3.connect(store.path) as conn:
            conn.execute(f"UPDATE jobs SET {column} = {damaged} WHERE task_id = ?", (bad.task_id,))
        with pytest.raises(CorruptRecordError, match=reason) as caught:
            await store.get(bad.task_id)
        assert caught.value.task_id == bad.task_id
        assert [job.task_id for job in (await store.list_jobs(limit=10)).jobs] == [good.task_id]
        [claimed] = await store.claim("w", limit=10, now=3.0, lease_s=30.0)
        assert claimed.task_id == good.task_id
        status, error = await stored_state(store, bad.task_id)
        assert status == "failed" and error is not None and error["type"] == "corrupt_record"


async def test_sqlite_a_webhook_url_that_is_not_utf8_does_not_keep_its_job_from_failing(
    tmp_path: Path,
) -> None:
    async with opened("sqlite", tmp_path) as store:
        assert isinstance(store, SQLiteBackend)
        job, _ = await store.enqueue(new_job("t", now=1.0, webhook_url="https://h.test/in"))
        with sqlite3.connect(store.path) as conn:
            conn.execute(  # the job unreadable, and its webhook_url column too
                "UPDATE jobs SET metadata = '{', webhook_url = CAST(X'68FF' AS TEXT)"
                " WHERE task_id = ?",
                (job.task_id,),
            )
        assert await store.claim("w", limit=1, now=2.0, lease_s=30.0) == []
        status, error = await stored_state(store, job.task_id)
        assert status == "failed" and error is not None and error["type"] == "corrupt_record"
        assert await store.claim_webhooks(now=3.0, limit=10, lease_s=30.0) == []
