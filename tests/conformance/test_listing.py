"""list_jobs (order, filters, cursor pagination) and stats."""

from __future__ import annotations

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, RetryAt
from backburner.errors import InvalidInputError
from backburner.models import JobStatus

from ._support import LEASE, T0, TTL, claim_one, drive, enqueue, error


async def _ids(backend: Backend, **filters: object) -> list[str]:
    page = await backend.list_jobs(limit=1000, **filters)  # type: ignore[arg-type]
    assert page.next_cursor is None
    return [j.task_id for j in page.jobs]


async def _all_pages(backend: Backend, limit: int, **filters: object) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = await backend.list_jobs(limit=limit, cursor=cursor, **filters)  # type: ignore[arg-type]
        pages.append([j.task_id for j in page.jobs])
        if page.next_cursor is None:
            return pages
        assert len(page.jobs) == limit
        cursor = page.next_cursor
        assert len(pages) < 100, "pagination does not end"


async def test_newest_first(backend: Backend) -> None:
    jobs = [await enqueue(backend, now=T0 + i, payload={"i": i}) for i in range(5)]
    assert await _ids(backend) == [j.task_id for j in reversed(jobs)]
    page = await backend.list_jobs()
    assert [j.input for j in page.jobs] == [{"i": i} for i in reversed(range(5))]


async def test_an_empty_listing(backend: Backend) -> None:
    page = await backend.list_jobs()
    assert page.jobs == [] and page.next_cursor is None


async def test_listing_shows_the_current_state(backend: Backend) -> None:
    job = await drive(backend, JobStatus.COMPLETED)
    (listed,) = (await backend.list_jobs()).jobs
    stored = await backend.get(job.task_id)
    assert stored is not None and listed.model_dump() == stored.model_dump()


async def test_status_and_type_filters(backend: Backend) -> None:
    completed = await drive(backend, JobStatus.COMPLETED, task_type="a", now=T0)
    failed = await drive(backend, JobStatus.FAILED, task_type="b", now=T0 + 10)
    processing = await drive(backend, JobStatus.PROCESSING, task_type="a", now=T0 + 20)
    cancelled = await drive(backend, JobStatus.CANCELLED, task_type="b", now=T0 + 30)
    queued_a = await drive(backend, JobStatus.QUEUED, task_type="a", now=T0 + 40)
    queued_b = await drive(backend, JobStatus.QUEUED, task_type="b", now=T0 + 50)

    assert await _ids(backend, status=JobStatus.QUEUED) == [queued_b.task_id, queued_a.task_id]
    assert await _ids(backend, status=JobStatus.PROCESSING) == [processing.task_id]
    assert await _ids(backend, status=JobStatus.COMPLETED) == [completed.task_id]
    assert await _ids(backend, status=JobStatus.FAILED) == [failed.task_id]
    assert await _ids(backend, status=JobStatus.CANCELLED) == [cancelled.task_id]
    assert await _ids(backend, type="a") == [
        queued_a.task_id,
        processing.task_id,
        completed.task_id,
    ]
    assert await _ids(backend, type="b", status=JobStatus.QUEUED) == [queued_b.task_id]
    assert await _ids(backend, type="a", status=JobStatus.FAILED) == []
    assert await _ids(backend, type="nope") == []
    assert len(await _ids(backend)) == 6


async def test_pagination_visits_every_job_exactly_once(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(7)]
    pages = await _all_pages(backend, limit=3)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [t for p in pages for t in p] == [j.task_id for j in reversed(jobs)]


async def test_pagination_when_the_last_page_is_full(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(6)]
    pages = await _all_pages(backend, limit=3)
    # No empty trailing page: the second page already says there is no more.
    assert [len(p) for p in pages] == [3, 3]
    assert [t for p in pages for t in p] == [j.task_id for j in reversed(jobs)]
    exact = await backend.list_jobs(limit=6)
    assert len(exact.jobs) == 6 and exact.next_cursor is None


async def test_pagination_with_a_filter(backend: Backend) -> None:
    wanted = []
    for i in range(10):
        job = await enqueue(backend, task_type="even" if i % 2 == 0 else "odd", payload={"i": i})
        if i % 2 == 0:
            wanted.append(job.task_id)
    pages = await _all_pages(backend, limit=2, type="even")
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [t for p in pages for t in p] == list(reversed(wanted))


async def test_pagination_by_status_or_type_alone_interleaves_the_others(
    backend: Backend,
) -> None:
    """Jobs of three types in several statuses, enqueued in turns: a listing by status alone
    (over every type) and by type alone (over every status) pages through in enqueue order,
    newest first, each job once."""
    statuses = [JobStatus.QUEUED, JobStatus.COMPLETED, JobStatus.QUEUED, JobStatus.PROCESSING]
    jobs = []
    for i in range(24):
        task_type, status = "abc"[i % 3], statuses[i % 4]
        # The queued ones are due later, so each claim of drive() takes the job it enqueued.
        due = {"run_at": T0 + 10_000} if status == JobStatus.QUEUED else {}
        job = await drive(backend, status, task_type=task_type, now=T0 + i, **due)
        jobs.append((job, task_type))
    queued = [j.task_id for j, _ in reversed(jobs) if j.status == JobStatus.QUEUED]
    of_b = [j.task_id for j, ty in reversed(jobs) if ty == "b"]
    assert len(queued) == 12 and len(of_b) == 8
    pages = await _all_pages(backend, limit=5, status=JobStatus.QUEUED)
    assert [len(p) for p in pages] == [5, 5, 2]
    assert [t for p in pages for t in p] == queued
    pages = await _all_pages(backend, limit=3, type="b")
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [t for p in pages for t in p] == of_b
    of_b_by_tenant = await _ids(backend, type="b", tenant="default")
    assert of_b_by_tenant == of_b


async def test_a_long_listing_by_status_across_types_is_whole_and_in_order(
    backend: Backend,
) -> None:
    """More jobs than one step of a merged walk looks at (pages of 120 over 3 types)."""
    jobs = [await enqueue(backend, task_type="xyz"[i % 3], payload={"i": i}) for i in range(250)]
    pages = await _all_pages(backend, limit=120, status=JobStatus.QUEUED)
    assert [len(p) for p in pages] == [120, 120, 10]
    assert [t for p in pages for t in p] == [j.task_id for j in reversed(jobs)]


async def test_pagination_is_stable_under_inserts(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(6)]
    first = await backend.list_jobs(limit=2)
    assert [j.task_id for j in first.jobs] == [jobs[5].task_id, jobs[4].task_id]
    assert first.next_cursor is not None
    for i in range(3):  # newer jobs arrive while a client pages through
        await enqueue(backend, payload={"new": i})
    rest: list[str] = []
    cursor: str | None = first.next_cursor
    while cursor is not None:
        page = await backend.list_jobs(limit=2, cursor=cursor)
        rest.extend(j.task_id for j in page.jobs)
        cursor = page.next_cursor
    assert rest == [j.task_id for j in reversed(jobs[:4])]


async def test_pagination_survives_state_changes(backend: Backend) -> None:
    jobs = [await enqueue(backend, payload={"i": i}) for i in range(6)]
    first = await backend.list_jobs(limit=3)
    # Jobs change status between pages; the unfiltered listing still visits each once.
    for job in await backend.claim("w1", limit=6, now=T0, lease_s=LEASE):
        await backend.finish(job.task_id, job.fence, Complete(result=1), now=T0 + 1)
    second = await backend.list_jobs(limit=3, cursor=first.next_cursor)
    seen = [j.task_id for j in first.jobs + second.jobs]
    assert seen == [j.task_id for j in reversed(jobs)]
    assert second.next_cursor is None
    assert all(j.status == JobStatus.COMPLETED for j in second.jobs)


# -- stats ----------------------------------------------------------------------------------------


async def test_stats_of_an_empty_backend(backend: Backend) -> None:
    stats = await backend.stats(now=T0)
    assert stats.counts == {status: 0 for status in JobStatus}
    assert stats.queued_by_priority == {}
    assert stats.dead_letter == 0
    assert stats.workers == []
    assert stats.due == 0


async def test_stats_counts_every_status(backend: Backend) -> None:
    await drive(backend, JobStatus.COMPLETED)
    await drive(backend, JobStatus.COMPLETED)
    await drive(backend, JobStatus.FAILED)
    await drive(backend, JobStatus.FAILED)
    await drive(backend, JobStatus.FAILED)
    await drive(backend, JobStatus.PROCESSING)
    await drive(backend, JobStatus.CANCELLED)
    for priority in (5, 5, 0, -1):
        await drive(backend, JobStatus.QUEUED, priority=priority)
    await drive(backend, JobStatus.QUEUED, priority=5, run_at=T0 + 1000)  # delayed still counts
    stats = await backend.stats(now=T0)
    assert stats.counts == {
        JobStatus.QUEUED: 5,
        JobStatus.PROCESSING: 1,
        JobStatus.COMPLETED: 2,
        JobStatus.FAILED: 3,
        JobStatus.CANCELLED: 1,
    }
    assert stats.queued_by_priority == {5: 3, 0: 1, -1: 1}
    assert list(stats.queued_by_priority) == [5, 0, -1]  # highest priority first
    assert stats.dead_letter == 3
    assert stats.due == 4  # the delayed one waits
    assert (await backend.stats(now=T0 + 1000)).due == 5  # due at its run_at


async def test_stats_count_as_due_only_the_queued_jobs_whose_time_has_come(
    backend: Backend,
) -> None:
    # The autoscaling signal: delayed jobs and retries in backoff made workers for nothing.
    running = await drive(backend, JobStatus.PROCESSING)  # claimed at T0 + 1
    await backend.finish(running.task_id, running.fence, RetryAt(error(), T0 + 60), now=T0 + 2)
    await enqueue(backend, now=T0 + 2, run_at=T0 + 3600)
    await enqueue(backend, now=T0 + 2)
    assert (await backend.stats(now=T0 + 2)).due == 1
    assert (await backend.stats(now=T0 + 60)).due == 2
    assert (await backend.stats(now=T0 + 3600)).due == 3


async def test_stats_agree_with_listings_through_every_transition(backend: Backend) -> None:
    """Counts must match what list_jobs shows after each kind of transition."""

    async def check() -> None:
        stats = await backend.stats(now=T0)
        for status in JobStatus:
            assert stats.counts[status] == len(await _ids(backend, status=status)), status
        assert stats.dead_letter == stats.counts[JobStatus.FAILED]
        queued = (await backend.list_jobs(status=JobStatus.QUEUED, limit=1000)).jobs
        by_priority: dict[int, int] = {}
        for job in queued:
            by_priority[job.priority] = by_priority.get(job.priority, 0) + 1
        assert stats.queued_by_priority == by_priority

    jobs = [await enqueue(backend, priority=i % 3, payload={"i": i}) for i in range(6)]
    await check()
    claimed = await backend.claim("w1", limit=5, now=T0, lease_s=LEASE)
    await check()
    a, b, c, d, e = claimed
    await backend.finish(a.task_id, a.fence, Complete(result=1), now=T0 + 1)
    await backend.finish(b.task_id, b.fence, Fail(error(), ttl_s=TTL), now=T0 + 1)
    await backend.finish(c.task_id, c.fence, RetryAt(error(), run_at=T0 + 2), now=T0 + 1)
    await backend.cancel(d.task_id, now=T0 + 1)
    await check()
    await backend.replay(b.task_id, now=T0 + 2, extra_attempts=1)
    await check()
    await backend.delete(a.task_id)
    await backend.cancel(jobs[5].task_id, now=T0 + 3)
    await check()
    again = await claim_one(backend, now=T0 + 5)
    await backend.finish(again.task_id, again.fence, Complete(), now=T0 + 5)
    await backend.finish(e.task_id, e.fence, Complete(), now=T0 + 5)
    await backend.purge_expired(now=T0 + 5 + TTL, limit=100)
    await check()


async def test_a_cursor_not_handed_out_is_invalid_input(backend: Backend) -> None:
    with pytest.raises(InvalidInputError, match="invalid cursor"):
        await backend.list_jobs(cursor="not-a-cursor")
