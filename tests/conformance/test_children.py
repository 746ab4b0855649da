"""Pipelines in the backend: the parent a child carries, listing a job's children, parking an
attempt with ``Wait``, ``wake`` and ``has_open_children``."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, Release, RetryAt, Wait
from backburner.backends.sqlite import SQLiteBackend
from backburner.errors import LeaseLostError
from backburner.models import Job, JobStatus

from ._support import (
    LEASE,
    T0,
    TTL,
    claim_one,
    drive,
    enqueue,
    error,
    event_data,
    new_job,
    peer,
    snapshot,
)

HOOK = "https://hooks.example.com/in"
LATER = T0 + 3600.0
"""When a parked job is due if nobody wakes it."""


async def child(backend: Backend, parent: Job | str, **kwargs: Any) -> Job:
    parent_id = parent if isinstance(parent, str) else parent.task_id
    return await enqueue(backend, parent_id=parent_id, **kwargs)


async def parked(backend: Backend, *, now: float = T0 + 5, **kwargs: Any) -> Job:
    """A job claimed at T0+1 that finished its attempt with Wait(LATER) at ``now``."""
    job = await drive(backend, JobStatus.PROCESSING, **kwargs)
    return await backend.finish(job.task_id, job.fence, Wait(LATER, "children"), now=now)


async def picks(backend: Backend, count: int, *, now: float) -> list[str]:
    """The ids of ``count`` jobs claimed one at a time (a single-slot worker's order)."""
    return [(await claim_one(backend, now=now)).task_id for _ in range(count)]


async def all_pages(backend: Backend, limit: int, **filters: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    while True:
        page = await backend.list_jobs(limit=limit, cursor=cursor, **filters)
        pages.append([j.task_id for j in page.jobs])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


# -- the parent a child carries ------------------------------------------------------------------


async def test_a_child_keeps_its_parent_through_every_read(backend: Backend) -> None:
    parent = await enqueue(backend, run_at=T0 + 100)  # not claimed below
    assert parent.parent_id is None
    kid = await child(backend, parent)
    assert kid.parent_id == parent.task_id
    stored = await backend.get(kid.task_id)
    assert stored is not None and stored.parent_id == parent.task_id
    claimed = await claim_one(backend, kid.task_id)
    assert claimed.parent_id == parent.task_id
    (listed,) = (await backend.list_jobs(parent_id=parent.task_id)).jobs
    assert listed.parent_id == parent.task_id
    done = await backend.finish(kid.task_id, claimed.fence, Complete(1), now=T0 + 1)
    assert done.parent_id == parent.task_id
    stored_parent = await backend.get(parent.task_id)
    assert stored_parent is not None and stored_parent.parent_id is None


async def test_a_repeated_idempotent_child_answers_with_its_parent(backend: Backend) -> None:
    first, created = await backend.enqueue(new_job(parent_id="task_p", idempotency_key="k"))
    assert created is True
    again, created = await backend.enqueue(new_job(parent_id="task_p", idempotency_key="k"))
    assert created is False
    assert again.task_id == first.task_id and again.parent_id == "task_p"


# -- listing a job's children -------------------------------------------------------------------


async def test_listing_a_jobs_children_newest_first(backend: Backend) -> None:
    parent = await enqueue(backend, run_at=T0 + 100)
    other = await enqueue(backend, run_at=T0 + 100)
    kids = [await child(backend, parent, payload={"i": i}) for i in range(7)]
    others = [await child(backend, other, payload={"i": i}) for i in range(2)]
    await enqueue(backend)
    newest_first = [k.task_id for k in reversed(kids)]
    assert await all_pages(backend, 3, parent_id=parent.task_id) == [
        newest_first[:3],
        newest_first[3:6],
        newest_first[6:],
    ]
    assert await all_pages(backend, 10, parent_id=other.task_id) == [
        [k.task_id for k in reversed(others)]
    ]
    assert (await backend.list_jobs(parent_id="task_nobody")).jobs == []
    assert (await backend.list_jobs(parent_id=kids[0].task_id)).jobs == []  # no grandchildren
    assert len((await backend.list_jobs(limit=100)).jobs) == 12


async def test_listing_a_jobs_children_by_status(backend: Backend) -> None:
    parent = await enqueue(backend, run_at=T0 + 100)
    kids = [await child(backend, parent, payload={"i": i}) for i in range(6)]
    other = await child(backend, "task_other")
    claimed = await backend.claim("w1", limit=3, now=T0, lease_s=LEASE)
    assert [j.task_id for j in claimed] == [k.task_id for k in kids[:3]]
    for job in claimed[:2]:
        await backend.finish(job.task_id, job.fence, Complete(1), now=T0 + 1)
    assert await all_pages(backend, 1, parent_id=parent.task_id, status=JobStatus.COMPLETED) == [
        [kids[1].task_id],
        [kids[0].task_id],
    ]
    processing = await backend.list_jobs(parent_id=parent.task_id, status=JobStatus.PROCESSING)
    assert [j.task_id for j in processing.jobs] == [kids[2].task_id]
    assert await all_pages(backend, 2, parent_id=parent.task_id, status=JobStatus.QUEUED) == [
        [kids[5].task_id, kids[4].task_id],
        [kids[3].task_id],
    ]
    queued = await backend.list_jobs(status=JobStatus.QUEUED, limit=100)
    assert other.task_id in {j.task_id for j in queued.jobs}  # queued, but another's child
    failed = await backend.list_jobs(parent_id=parent.task_id, status=JobStatus.FAILED)
    assert failed.jobs == [] and failed.next_cursor is None


async def test_listing_children_with_the_other_filters(backend: Backend) -> None:
    parent = await enqueue(backend, run_at=T0 + 100)
    wanted = await child(backend, parent, task_type="translate", tenant="acme")
    await child(backend, parent, task_type="summarize", tenant="acme")
    await child(backend, parent, task_type="translate", tenant="globex")
    await enqueue(backend, task_type="translate", tenant="acme")  # nobody's child
    page = await backend.list_jobs(parent_id=parent.task_id, type="translate", tenant="acme")
    assert [j.task_id for j in page.jobs] == [wanted.task_id]


# -- Wait: an attempt parks its job --------------------------------------------------------------


async def test_wait_parks_the_job_until_run_at(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING, webhook_url=HOOK)  # claimed at T0+1
    waiting = await backend.finish(job.task_id, job.fence, Wait(LATER, "children"), now=T0 + 5)
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.model_dump() == waiting.model_dump()
    assert waiting.status == JobStatus.QUEUED
    assert waiting.attempts == 0  # the attempt is given back
    assert waiting.run_at == LATER
    assert waiting.worker_id is None and waiting.lease_expires_at is None
    assert waiting.error is None and waiting.expires_at is None and waiting.finished_at is None
    (record,) = waiting.history
    assert (record.attempt, record.worker_id, record.started_at) == (1, "w1", T0 + 1)
    assert (record.finished_at, record.outcome, record.error) == (T0 + 5, "waiting", None)
    assert await event_data(backend, job.task_id, after=2) == [
        ("status", {"status": "queued", "waiting": "children"}),
    ]
    assert await backend.webhook_deliveries(job.task_id) == []  # no message: not terminal
    assert await backend.tenant_in_flight("default") == 1  # queued stays in flight
    # Not claimable before run_at; at run_at it is, as attempt 1 again under a new fence.
    assert await backend.claim("w2", limit=10, now=LATER - 1, lease_s=LEASE) == []
    again = await claim_one(backend, job.task_id, worker="w2", now=LATER)
    assert (again.attempts, again.fence) == (1, 2)
    assert [h.outcome for h in again.history] == ["waiting", None]
    with pytest.raises(LeaseLostError):  # the parked attempt's fence stays dead
        await backend.finish(job.task_id, job.fence, Complete(), now=LATER + 1)


async def test_wait_keeps_a_previous_attempts_error(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    lost = error()
    await backend.finish(job.task_id, job.fence, RetryAt(lost, run_at=T0 + 2), now=T0 + 2)
    again = await claim_one(backend, job.task_id, now=T0 + 2)
    waiting = await backend.finish(job.task_id, again.fence, Wait(LATER), now=T0 + 3)
    assert waiting.attempts == 1 and waiting.error == lost
    assert [h.outcome for h in waiting.history] == ["retry", "waiting"]
    assert (await event_data(backend, job.task_id))[-1] == (
        "status",
        {"status": "queued", "waiting": "waiting"},  # the default reason
    )


async def test_wait_stores_the_attempts_usage_so_far(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    spent = {"input_tokens": 10, "output_tokens": 5, "calls": 1}
    waiting = await backend.finish(job.task_id, job.fence, Wait(LATER, usage=spent), now=T0 + 5)
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.model_dump() == waiting.model_dump()
    assert waiting.usage is not None and waiting.usage.model_dump() == spent
    again = await claim_one(backend, job.task_id, worker="w2", now=LATER)
    again_spent = {"input_tokens": 12, "output_tokens": 6, "calls": 2}
    kept = await backend.finish(
        job.task_id, again.fence, Wait(LATER + 5, usage=again_spent), now=LATER + 1
    )
    assert kept.usage is not None and kept.usage.model_dump() == again_spent
    handed = await claim_one(backend, job.task_id, worker="w2", now=LATER + 5)
    left = await backend.finish(job.task_id, handed.fence, Release(), now=LATER + 5)
    assert left.usage is not None and left.usage.model_dump() == again_spent  # None: as it is
    handed = await claim_one(backend, job.task_id, worker="w2", now=LATER + 5)
    spent_more = {"input_tokens": 14, "output_tokens": 7, "calls": 3}
    left = await backend.finish(job.task_id, handed.fence, Release(usage=spent_more), now=LATER + 5)
    assert left.usage is not None and left.usage.model_dump() == spent_more
    handed = await claim_one(backend, job.task_id, worker="w2", now=LATER + 5)
    cleared = await backend.finish(
        job.task_id, handed.fence, Wait(LATER + 5, usage={}), now=LATER + 5
    )
    assert cleared.usage is None  # {}: none so far (a new attempt's)
    last = await claim_one(backend, job.task_id, worker="w2", now=LATER + 5)
    more = {"input_tokens": 17, "output_tokens": 8, "calls": 2}
    done = await backend.finish(job.task_id, last.fence, Complete(1, usage=more), now=LATER + 6)
    assert done.usage is not None and done.usage.model_dump() == more


@pytest.mark.parametrize("delta", [1, -1])
async def test_wait_with_a_stale_fence_changes_nothing(backend: Backend, delta: int) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError) as raised:
        await backend.finish(job.task_id, job.fence + delta, Wait(LATER), now=T0 + 5)
    assert (raised.value.task_id, raised.value.fence) == (job.task_id, job.fence + delta)
    assert await snapshot(backend, job.task_id) == before


async def test_wait_on_a_job_not_processing_is_refused(backend: Backend) -> None:
    for status in (JobStatus.COMPLETED, JobStatus.CANCELLED, JobStatus.QUEUED):
        job = await drive(backend, status)
        before = await snapshot(backend, job.task_id)
        with pytest.raises(LeaseLostError):
            await backend.finish(job.task_id, max(job.fence, 1), Wait(LATER), now=T0 + 5)
        assert await snapshot(backend, job.task_id) == before


async def test_wait_only_if_lease_expired(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)  # lease until T0 + 1 + LEASE
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError):
        await backend.finish(
            job.task_id, job.fence, Wait(LATER), now=T0 + 2, only_if_lease_expired=True
        )
    assert await snapshot(backend, job.task_id) == before
    waiting = await backend.finish(
        job.task_id, job.fence, Wait(LATER), now=T0 + 1 + LEASE, only_if_lease_expired=True
    )
    assert waiting.status == JobStatus.QUEUED and waiting.run_at == LATER


async def test_a_wait_due_at_once_joins_the_back_of_its_tenants_line(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(3)]
    first = await claim_one(backend, jobs[0].task_id)
    waiting = await backend.finish(first.task_id, first.fence, Wait(T0 + 1), now=T0 + 1)
    assert waiting.run_at == T0 + 1
    assert await picks(backend, 3, now=T0 + 1) == [j.task_id for j in [*jobs[1:], jobs[0]]]


# -- wake -------------------------------------------------------------------------------------


async def test_wake_makes_a_parked_job_due_now(backend: Backend) -> None:
    job = await parked(backend)
    before = await backend.get(job.task_id)
    assert await backend.claim("w1", limit=10, now=T0 + 10, lease_s=LEASE) == []
    assert await backend.wake(job.task_id, now=T0 + 10) is True
    woken = await backend.get(job.task_id)
    assert woken is not None and before is not None
    assert woken.status == JobStatus.QUEUED and woken.run_at == T0 + 10
    assert woken.model_dump(exclude={"run_at"}) == before.model_dump(exclude={"run_at"})
    assert len(await backend.events(job.task_id)) == 3  # queued, processing, waiting: no event
    # Repeating it is harmless: the job is due now.
    assert await backend.wake(job.task_id, now=T0 + 10) is False
    assert await backend.wake(job.task_id, now=T0 + 20) is False
    again = await backend.get(job.task_id)
    assert again is not None and again.run_at == T0 + 10
    claimed = await claim_one(backend, job.task_id, now=T0 + 10)
    assert (claimed.attempts, claimed.fence) == (1, 2)


async def test_wake_makes_a_delayed_job_due_now(backend: Backend) -> None:
    job = await enqueue(backend, task_type="fresh", run_at=T0 + 100)
    assert await backend.wake(job.task_id, now=T0) is True
    await claim_one(backend, job.task_id, now=T0)


async def test_wake_changes_nothing_unless_the_job_is_queued_and_not_due(
    backend: Backend,
) -> None:
    assert await backend.wake("task_missing", now=T0) is False
    assert await backend.get("task_missing") is None
    jobs = [
        await drive(backend, JobStatus.PROCESSING),
        await drive(backend, JobStatus.COMPLETED),
        await drive(backend, JobStatus.FAILED),
        await drive(backend, JobStatus.CANCELLED),
        await enqueue(backend, now=T0),  # due
        await enqueue(backend, now=T0, run_at=T0 + 5),  # due exactly at the wake
    ]
    before = [await snapshot(backend, j.task_id) for j in jobs]
    for job in jobs:
        assert await backend.wake(job.task_id, now=T0 + 5) is False
    assert [await snapshot(backend, j.task_id) for j in jobs] == before


async def test_wake_wakes_a_waiting_worker(backend: Backend) -> None:
    job = await parked(backend)
    async with peer(backend) as other:
        for _ in range(5):  # a wait that is really waiting (spurious wake-ups are allowed)
            waiter = asyncio.create_task(backend.wait_for_jobs(now=T0 + 10, timeout=30))
            await asyncio.sleep(0.05)
            if not waiter.done():
                break
            await waiter
        else:
            pytest.fail("wait_for_jobs with nothing due never waits")
        started = time.monotonic()
        assert await other.wake(job.task_id, now=T0 + 10) is True
        await asyncio.wait_for(waiter, 5.0)
        assert time.monotonic() - started < 5.0


async def test_a_woken_job_takes_its_fair_share_place(backend: Backend) -> None:
    pipeline = await enqueue(backend, tenant="acme")
    claimed = await claim_one(backend, pipeline.task_id)
    backlog = [await enqueue(backend, tenant="acme", payload={"i": i}) for i in range(5)]
    await backend.finish(pipeline.task_id, claimed.fence, Wait(LATER), now=T0 + 1)
    small = await enqueue(backend, tenant="globex", now=T0 + 1)
    assert await backend.wake(pipeline.task_id, now=T0 + 2) is True
    # The woken job neither jumps its own tenant's line nor pushes another tenant back.
    order = await picks(backend, 7, now=T0 + 2)
    assert order[:2] == [backlog[0].task_id, small.task_id]
    assert order[2:] == [j.task_id for j in backlog[1:]] + [pipeline.task_id]


# -- has_open_children --------------------------------------------------------------------------


async def test_has_open_children_follows_the_childrens_states(backend: Backend) -> None:
    parent = await parked(backend)
    assert await backend.has_open_children(parent.task_id) is False
    assert await backend.has_open_children("task_missing") is False
    first = await child(backend, parent, now=T0 + 10)
    second = await child(backend, parent, now=T0 + 10)
    cancelled = await child(backend, parent, now=T0 + 10)
    await child(backend, "task_other", now=T0 + 10, run_at=LATER)  # another job's child
    await backend.cancel(cancelled.task_id, now=T0 + 10)
    assert await backend.has_open_children(parent.task_id) is True  # two queued
    one, two = await backend.claim("w1", limit=2, now=T0 + 10, lease_s=LEASE)
    assert {one.task_id, two.task_id} == {first.task_id, second.task_id}
    assert await backend.has_open_children(parent.task_id) is True  # two processing
    await backend.finish(one.task_id, one.fence, Complete(1), now=T0 + 11)
    assert await backend.has_open_children(parent.task_id) is True  # one processing
    await backend.finish(two.task_id, two.fence, RetryAt(error(), run_at=T0 + 50), now=T0 + 11)
    assert await backend.has_open_children(parent.task_id) is True  # one retrying (queued)
    retried = await claim_one(backend, two.task_id, now=T0 + 50)
    await backend.finish(two.task_id, retried.fence, Fail(error(), ttl_s=TTL), now=T0 + 51)
    assert await backend.has_open_children(parent.task_id) is False  # all ended
    assert await backend.has_open_children("task_other") is True
    delayed = await child(backend, parent, now=T0 + 52, run_at=T0 + 500)
    assert await backend.has_open_children(parent.task_id) is True  # queued, not due yet
    await backend.cancel(delayed.task_id, now=T0 + 53)
    assert await backend.has_open_children(parent.task_id) is False


async def test_a_parked_child_is_open(backend: Backend) -> None:
    kid = await parked(backend, parent_id="task_parent")
    assert kid.parent_id == "task_parent"
    assert await backend.has_open_children("task_parent") is True
    assert await backend.has_open_children(kid.task_id) is False


# -- SQLite: a file from before pipelines --------------------------------------------------------


async def test_a_sqlite_file_from_before_children_is_upgraded(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    engine = SQLiteBackend(path)
    await engine.connect()
    try:
        old, _ = await engine.enqueue(new_job())
    finally:
        await engine.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX jobs_children")
        conn.execute("DROP INDEX jobs_children_status")
        for trigger in ("jobs_line_insert", "jobs_line_status", "jobs_line_delete"):
            conn.execute(f"DROP TRIGGER {trigger}")  # a file from before children had others
        conn.execute("ALTER TABLE jobs DROP COLUMN parent_id")
    conn.close()
    engine = SQLiteBackend(path)
    await engine.connect()
    try:
        stored = await engine.get(old.task_id)
        assert stored is not None and stored.parent_id is None
        kid, _ = await engine.enqueue(new_job(parent_id=old.task_id))
        assert [j.task_id for j in (await engine.list_jobs(parent_id=old.task_id)).jobs] == [
            kid.task_id
        ]
        assert await engine.has_open_children(old.task_id) is True
        assert await engine.tenant_in_flight("default") == 1  # the child is not counted
    finally:
        await engine.close()
    with sqlite3.connect(path) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    conn.close()
    assert {"jobs_children", "jobs_children_status"} <= names


async def test_children_do_not_count_in_their_tenants_jobs_in_flight(backend: Backend) -> None:
    parent = await enqueue(backend, tenant="acme")
    for i in range(3):
        await backend.enqueue(new_job(tenant="acme", parent_id=parent.task_id, payload={"i": i}))
    assert await backend.tenant_in_flight("acme") == 1
    assert await backend.has_open_children(parent.task_id) is True
    for child in (await backend.list_jobs(parent_id=parent.task_id)).jobs:
        await backend.cancel(child.task_id, now=T0)
    assert await backend.tenant_in_flight("acme") == 1
    assert await backend.has_open_children(parent.task_id) is False
