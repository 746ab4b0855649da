"""append_event (sequence numbers, progress, fencing, JSON-only data) and reading events."""

from __future__ import annotations

import pytest

from backburner.backends import Backend
from backburner.backends.base import Release
from backburner.errors import InvalidInputError, LeaseLostError
from backburner.models import JobStatus, Progress

from ._support import T0, claim_one, drive, enqueue, snapshot


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
