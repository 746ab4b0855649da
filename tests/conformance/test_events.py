"""append_event (sequence numbers, progress, fencing, JSON-only data) and reading events."""

from __future__ import annotations

from typing import Any

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, Release, RetryAt, Wait
from backburner.errors import InvalidInputError, LeaseLostError
from backburner.models import JobStatus, Progress

from ._support import T0, claim_one, drive, enqueue, error, snapshot


async def test_seq_grows_by_one_per_job(backend: Backend) -> None:
    a = await drive(backend, JobStatus.PROCESSING)
    b = await drive(backend, JobStatus.PROCESSING)
    seqs_a = [
        await backend.append_event(a.task_id, a.fence, "log", {"i": i}, now=T0 + 10 + i)
        for i in range(4)
    ]
    seq_b = await backend.append_event(b.task_id, b.fence, "log", {"i": 0}, now=T0 + 20)
    seqs_a.append(await backend.append_event(a.task_id, a.fence, "log", None, now=T0 + 30))
    # Two events (queued, processing) precede them on each job.
    assert seqs_a == [3, 4, 5, 6, 7]
    assert seq_b == 3
    events = await backend.events(a.task_id)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6, 7]
    assert [(e.type, e.data, e.at) for e in events[2:]] == [
        ("log", {"i": 0}, T0 + 10),
        ("log", {"i": 1}, T0 + 11),
        ("log", {"i": 2}, T0 + 12),
        ("log", {"i": 3}, T0 + 13),
        ("log", None, T0 + 30),
    ]
    assert all(e.task_id == a.task_id for e in events)


@pytest.mark.parametrize("after", [6, 10**14 - 1, 10**14, 10**15 + 7, 10**18 - 1])
async def test_reading_past_the_last_event_finds_none_however_far(
    backend: Backend, after: int
) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.append_event(job.task_id, job.fence, "log", {"i": 0}, now=T0 + 10)
    await backend.append_event(job.task_id, job.fence, "log", {"i": 1}, now=T0 + 11)
    assert [e.seq for e in await backend.events(job.task_id, after=2)] == [3, 4]
    assert await backend.events(job.task_id, after=after) == []


async def test_event_data_is_stored_as_json(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.append_event(
        job.task_id, job.fence, "chunk", {"t": (1, 2), "s": "ü", "n": None}, now=T0 + 5
    )
    await backend.append_event(job.task_id, job.fence, "text", "plain string", now=T0 + 6)
    await backend.append_event(job.task_id, job.fence, "list", [1, 2.5, True], now=T0 + 7)
    events = await backend.events(job.task_id, after=2)
    assert [(e.type, e.data) for e in events] == [
        ("chunk", {"t": [1, 2], "s": "ü", "n": None}),
        ("text", "plain string"),
        ("list", [1, 2.5, True]),
    ]


async def test_progress_is_stored_on_the_job(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    seq = await backend.append_event(
        job.task_id,
        job.fence,
        "progress",
        {"percent": 40},
        now=T0 + 5,
        progress=Progress(percent=40.0, message="reading"),
    )
    assert seq == 3
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.progress == Progress(percent=40.0, message="reading")
    # An event without progress leaves it as it was.
    await backend.append_event(job.task_id, job.fence, "log", "x", now=T0 + 6)
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.progress == Progress(percent=40.0, message="reading")
    await backend.append_event(
        job.task_id, job.fence, "progress", None, now=T0 + 7, progress=Progress(percent=90.0)
    )
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.progress == Progress(percent=90.0, message=None)


@pytest.mark.parametrize("delta", [1, -1, 100])
async def test_wrong_fence_is_refused_and_nothing_written(backend: Backend, delta: int) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError) as raised:
        await backend.append_event(
            job.task_id, job.fence + delta, "log", "late", now=T0 + 5, progress=Progress(percent=9)
        )
    assert raised.value.task_id == job.task_id
    assert raised.value.fence == job.fence + delta
    assert await snapshot(backend, job.task_id) == before


async def test_an_older_attempts_fence_is_refused(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.finish(job.task_id, job.fence, Release(), now=T0 + 3)
    again = await claim_one(backend, job.task_id, worker="w2", now=T0 + 4)
    assert again.fence == job.fence + 1
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError):
        await backend.append_event(job.task_id, job.fence, "log", "stale", now=T0 + 5)
    assert await snapshot(backend, job.task_id) == before
    assert await backend.append_event(job.task_id, again.fence, "log", "ok", now=T0 + 5) == 5


@pytest.mark.parametrize(
    "status",
    [JobStatus.QUEUED, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED],
)
async def test_a_job_that_is_not_processing_takes_no_events(
    backend: Backend, status: JobStatus
) -> None:
    job = await drive(backend, status)
    before = await snapshot(backend, job.task_id)
    for fence in {job.fence, job.fence + 1, 0, 1}:
        with pytest.raises(LeaseLostError):
            await backend.append_event(
                job.task_id, fence, "log", "x", now=T0 + 9, progress=Progress(percent=50)
            )
    assert await snapshot(backend, job.task_id) == before


async def test_a_released_job_takes_no_events_until_claimed_again(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.finish(job.task_id, job.fence, Release(), now=T0 + 3)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError):
        await backend.append_event(job.task_id, job.fence, "log", "x", now=T0 + 4)
    assert await snapshot(backend, job.task_id) == before


async def test_a_missing_job_takes_no_events(backend: Backend) -> None:
    with pytest.raises(LeaseLostError):
        await backend.append_event("task_missing", 1, "log", "x", now=T0)
    assert await backend.events("task_missing") == []


async def test_non_json_data_is_refused_and_nothing_written(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    for data in ({"x": object()}, float("nan"), {1, 2}):
        with pytest.raises(InvalidInputError):
            await backend.append_event(job.task_id, job.fence, "log", data, now=T0 + 5)
    assert await snapshot(backend, job.task_id) == before
    assert await backend.append_event(job.task_id, job.fence, "log", "ok", now=T0 + 6) == 3


async def test_non_json_data_with_progress_changes_nothing(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(InvalidInputError):
        await backend.append_event(
            job.task_id,
            job.fence,
            "progress",
            {"x": object()},
            now=T0 + 5,
            progress=Progress(percent=77.0, message="half"),
        )
    assert await snapshot(backend, job.task_id) == before


async def test_stale_fence_with_bad_data_raises_lease_lost(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError):
        await backend.append_event(job.task_id, job.fence + 1, "log", {"x": object()}, now=T0)
    assert await snapshot(backend, job.task_id) == before


# -- reading events -------------------------------------------------------------------------------


async def test_events_after_and_limit(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    for i in range(8):
        await backend.append_event(job.task_id, job.fence, "log", i, now=T0 + 10 + i)
    assert [e.seq for e in await backend.events(job.task_id)] == list(range(1, 11))
    assert [e.seq for e in await backend.events(job.task_id, after=4)] == [5, 6, 7, 8, 9, 10]
    assert [e.seq for e in await backend.events(job.task_id, after=4, limit=3)] == [5, 6, 7]
    assert [e.data for e in await backend.events(job.task_id, after=7, limit=2)] == [5, 6]
    assert await backend.events(job.task_id, after=10) == []
    assert await backend.events(job.task_id, after=50) == []
    assert await backend.events(job.task_id, limit=0) == []


async def test_events_after_a_negative_seq_returns_all(backend: Backend) -> None:
    job = await drive(backend, JobStatus.COMPLETED)
    everything = await backend.events(job.task_id)
    assert len(everything) == 3
    assert [e.seq for e in await backend.events(job.task_id, after=-1)] == [1, 2, 3]


async def test_events_of_a_missing_job_are_empty(backend: Backend) -> None:
    assert await backend.events("task_nope") == []


async def test_reads_do_not_share_state_with_the_store(backend: Backend) -> None:
    job = await enqueue(backend, payload={"q": [1]})
    got = await backend.get(job.task_id)
    assert got is not None
    got.input["q"].append(2)
    job.input["extra"] = True
    (await backend.events(job.task_id))[0].data["status"] = "tampered"
    again = await backend.get(job.task_id)
    assert again is not None and again.input == {"q": [1]}
    assert (await backend.events(job.task_id))[0].data == {"status": "queued"}


async def test_a_whole_life_reads_back_in_order_whole_and_page_by_page(backend: Backend) -> None:
    """Every kind of transition writes its events (a backend may keep some apart from the
    others, or make them from the job's record): the log reads back as one sequence, whole
    and in pages of any size, the same on every backend."""
    job = await enqueue(backend, max_attempts=5)
    first = await claim_one(backend, job.task_id, now=T0 + 1)
    late = RetryAt(error("rate_limited", "429"), run_at=T0 + 2.25)
    await backend.finish(job.task_id, first.fence, late, now=T0 + 1.5)
    second = await claim_one(backend, job.task_id, worker="w2", now=T0 + 3)
    await backend.finish(job.task_id, second.fence, Release("shutdown"), now=T0 + 3.5)
    third = await claim_one(backend, job.task_id, now=T0 + 4)
    await backend.append_event(job.task_id, third.fence, "token", {"text": "hi"}, now=T0 + 4.5)
    await backend.finish(job.task_id, third.fence, Wait(T0 + 5, "children"), now=T0 + 4.75)
    fourth = await claim_one(backend, job.task_id, now=T0 + 6)
    boom = error("bad", "no", retryable=False)
    await backend.finish(job.task_id, fourth.fence, Fail(boom, ttl_s=600), now=T0 + 6.5)
    await backend.replay(job.task_id, now=T0 + 7, extra_attempts=1)
    fifth = await claim_one(backend, job.task_id, worker="w3", now=T0 + 8)
    await backend.finish(job.task_id, fifth.fence, Complete({"n": 1.1}), now=T0 + 9)

    dumped = late.error.model_dump()
    failed = boom.model_dump()
    expected = [
        ("status", {"status": "queued"}, T0),
        ("status", {"status": "processing", "attempt": 1, "worker_id": "w1"}, T0 + 1),
        ("attempt_failed", {"error": dumped, "retry_at": T0 + 2.25, "attempt": 1}, T0 + 1.5),
        ("status", {"status": "queued"}, T0 + 1.5),
        ("status", {"status": "processing", "attempt": 2, "worker_id": "w2"}, T0 + 3),
        ("status", {"status": "queued", "released": "shutdown"}, T0 + 3.5),
        ("status", {"status": "processing", "attempt": 2, "worker_id": "w1"}, T0 + 4),
        ("token", {"text": "hi"}, T0 + 4.5),
        ("status", {"status": "queued", "waiting": "children"}, T0 + 4.75),
        ("status", {"status": "processing", "attempt": 2, "worker_id": "w1"}, T0 + 6),
        ("attempt_failed", {"error": failed, "attempt": 2}, T0 + 6.5),
        ("status", {"status": "failed", "error": failed}, T0 + 6.5),
        ("status", {"status": "queued", "replayed": True}, T0 + 7),
        ("status", {"status": "processing", "attempt": 3, "worker_id": "w3"}, T0 + 8),
        ("status", {"status": "completed", "result": {"n": 1.1}}, T0 + 9),
    ]
    await check_log(backend, job.task_id, expected)  # (a Release or a Wait charges no attempt)


async def test_claims_and_outcomes_alone_read_back_in_order(backend: Backend) -> None:
    """The same for a job with no events of its own, no Release, Wait, cancel or replay."""
    job = await enqueue(backend, max_attempts=3)
    first = await claim_one(backend, job.task_id, now=T0 + 1)
    late = RetryAt(error("rate_limited", "429"), run_at=T0 + 1.75)
    await backend.finish(job.task_id, first.fence, late, now=T0 + 1.5)
    second = await claim_one(backend, job.task_id, worker="w2", now=T0 + 2)
    boom = error("bad", 'no/way \\ "é"', retryable=False)
    await backend.finish(job.task_id, second.fence, Fail(boom, ttl_s=600), now=T0 + 2.5)
    done = await enqueue(backend)
    third = await claim_one(backend, done.task_id, now=T0 + 3)
    await backend.finish(done.task_id, third.fence, Complete(["a/b", None]), now=T0 + 3.25)

    dumped, failed = late.error.model_dump(), boom.model_dump()
    await check_log(
        backend,
        job.task_id,
        [
            ("status", {"status": "queued"}, T0),
            ("status", {"status": "processing", "attempt": 1, "worker_id": "w1"}, T0 + 1),
            ("attempt_failed", {"error": dumped, "retry_at": T0 + 1.75, "attempt": 1}, T0 + 1.5),
            ("status", {"status": "queued"}, T0 + 1.5),
            ("status", {"status": "processing", "attempt": 2, "worker_id": "w2"}, T0 + 2),
            ("attempt_failed", {"error": failed, "attempt": 2}, T0 + 2.5),
            ("status", {"status": "failed", "error": failed}, T0 + 2.5),
        ],
    )
    await check_log(
        backend,
        done.task_id,
        [
            ("status", {"status": "queued"}, T0),
            ("status", {"status": "processing", "attempt": 1, "worker_id": "w1"}, T0 + 3),
            ("status", {"status": "completed", "result": ["a/b", None]}, T0 + 3.25),
        ],
    )


async def check_log(backend: Backend, task_id: str, expected: list[tuple[str, Any, float]]) -> None:
    """The job's events are ``expected`` (type, data, at), seqs from 1, read whole and in
    pages of several sizes."""
    events = await backend.events(task_id)
    assert [e.seq for e in events] == list(range(1, len(expected) + 1))
    assert [(e.type, e.data, e.at) for e in events] == expected
    for size in (1, 2, 3, 7):
        paged, after = [], 0
        while page := await backend.events(task_id, after=after, limit=size):
            assert len(page) <= size
            paged += page
            after = page[-1].seq
        assert [e.model_dump() for e in paged] == [e.model_dump() for e in events], size
