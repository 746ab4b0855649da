"""finish with each outcome, its fencing, and the sweeper's only_if_lease_expired guard."""

from __future__ import annotations

from typing import Any

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, Outcome, Release, RetryAt
from backburner.errors import InvalidInputError, LeaseLostError
from backburner.models import Job, JobStatus, Progress

from ._support import (
    LEASE,
    T0,
    TTL,
    claim_one,
    drive,
    enqueue,
    error,
    event_data,
    snapshot,
)

OUTCOMES: list[Outcome] = [
    Complete(result={"ok": True}),
    Fail(error(retryable=False), ttl_s=500.0),
    RetryAt(error(), run_at=T0 + 100),
    Release(),
]
OUTCOME_IDS = ["complete", "fail", "retry", "release"]


async def test_complete(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING, ttl_s=120.0)  # claimed at T0+1
    await backend.append_event(
        job.task_id, job.fence, "progress", None, now=T0 + 2, progress=Progress(percent=60.0)
    )
    usage = {"input_tokens": 12, "output_tokens": 34, "model": "m-1"}
    done = await backend.finish(
        job.task_id, job.fence, Complete(result={"answer": [1, 2]}, usage=usage), now=T0 + 5
    )
    stored = await backend.get(job.task_id)
    assert stored is not None
    assert stored.model_dump() == done.model_dump()
    assert done.status == JobStatus.COMPLETED
    assert done.result == {"answer": [1, 2]}
    assert done.usage is not None and done.usage.model_dump() == usage
    assert done.error is None
    assert done.finished_at == T0 + 5
    assert done.expires_at == T0 + 5 + 120.0
    assert done.lease_expires_at is None
    assert done.progress.percent == 100
    assert (done.attempts, done.fence) == (1, 1)
    assert len(done.history) == 1
    record = done.history[0]
    assert (record.attempt, record.worker_id, record.started_at) == (1, "w1", T0 + 1)
    assert (record.finished_at, record.outcome, record.error) == (T0 + 5, "completed", None)
    events = await backend.events(job.task_id)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert (events[-1].type, events[-1].data, events[-1].at) == (
        "status",
        {"status": "completed", "result": {"answer": [1, 2]}},
        T0 + 5,
    )


async def test_complete_without_usage_or_result(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    done = await backend.finish(job.task_id, job.fence, Complete(), now=T0 + 5)
    assert done.status == JobStatus.COMPLETED
    assert done.result is None and done.usage is None
    assert (await event_data(backend, job.task_id))[-1] == (
        "status",
        {"status": "completed", "result": None},
    )


async def test_complete_after_a_retry_clears_the_error(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.finish(job.task_id, job.fence, RetryAt(error(), run_at=T0 + 2), now=T0 + 2)
    again = await claim_one(backend, job.task_id, now=T0 + 3)
    assert again.error is not None  # the last attempt's error stays visible while it runs
    done = await backend.finish(job.task_id, again.fence, Complete(result=1), now=T0 + 4)
    assert done.error is None and done.result == 1
    assert [h.outcome for h in done.history] == ["retry", "completed"]


async def test_complete_with_a_non_json_result_changes_nothing(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(InvalidInputError):
        await backend.finish(job.task_id, job.fence, Complete(result={"x": object()}), now=T0)
    with pytest.raises(InvalidInputError):
        await backend.finish(job.task_id, job.fence, Complete(result=float("nan")), now=T0)
    assert await snapshot(backend, job.task_id) == before


async def test_complete_with_non_json_usage_changes_nothing(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    bad = Complete(result=1, usage={"input_tokens": 1, "cost": float("nan")})
    with pytest.raises(InvalidInputError):
        await backend.finish(job.task_id, job.fence, bad, now=T0 + 5)
    assert await snapshot(backend, job.task_id) == before


async def test_fail(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING, ttl_s=60.0)
    boom = error("bad_input", "cannot parse", retryable=False)
    failed = await backend.finish(job.task_id, job.fence, Fail(boom, ttl_s=7200.0), now=T0 + 5)
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.model_dump() == failed.model_dump()
    assert failed.status == JobStatus.FAILED
    assert failed.error == boom
    assert failed.finished_at == T0 + 5
    assert failed.expires_at == T0 + 5 + 7200.0  # Fail's own retention, not the job's ttl_s
    assert failed.lease_expires_at is None
    assert failed.result is None
    record = failed.history[-1]
    assert (record.finished_at, record.outcome, record.error) == (T0 + 5, "failed", boom)
    events = await backend.events(job.task_id, after=2)
    dumped = boom.model_dump()
    assert [(e.seq, e.type, e.data, e.at) for e in events] == [
        (3, "attempt_failed", {"error": dumped, "attempt": 1}, T0 + 5),
        (4, "status", {"status": "failed", "error": dumped}, T0 + 5),
    ]
    stats = await backend.stats(now=T0 + 5)
    assert stats.dead_letter == 1 and stats.counts[JobStatus.FAILED] == 1


async def test_retry_at(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    transient = error("rate_limited", "429", retryable=True)
    retried = await backend.finish(
        job.task_id, job.fence, RetryAt(transient, run_at=T0 + 60), now=T0 + 5
    )
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.model_dump() == retried.model_dump()
    assert retried.status == JobStatus.QUEUED
    assert retried.run_at == T0 + 60
    assert retried.error == transient
    assert retried.attempts == 1  # the attempt is charged
    assert retried.lease_expires_at is None and retried.worker_id is None
    assert retried.expires_at is None and retried.finished_at is None
    record = retried.history[-1]
    assert (record.finished_at, record.outcome, record.error) == (T0 + 5, "retry", transient)
    events = await backend.events(job.task_id, after=2)
    dumped = transient.model_dump()
    assert [(e.seq, e.type, e.data, e.at) for e in events] == [
        (3, "attempt_failed", {"error": dumped, "retry_at": T0 + 60, "attempt": 1}, T0 + 5),
        (4, "status", {"status": "queued"}, T0 + 5),
    ]
    # Due at run_at, not before; the next attempt continues the count.
    assert await backend.claim("w2", limit=5, now=T0 + 59, lease_s=LEASE) == []
    again = await claim_one(backend, job.task_id, worker="w2", now=T0 + 60)
    assert (again.attempts, again.fence) == (2, 2)
    assert [(h.attempt, h.worker_id) for h in again.history] == [(1, "w1"), (2, "w2")]


async def test_release(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    released = await backend.finish(
        job.task_id, job.fence, Release(reason="worker shutdown"), now=T0 + 5
    )
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.model_dump() == released.model_dump()
    assert released.status == JobStatus.QUEUED
    assert released.attempts == 0  # the attempt is given back
    assert released.run_at == T0 + 5
    assert released.lease_expires_at is None and released.worker_id is None
    assert released.error is None and released.expires_at is None
    record = released.history[-1]
    assert (record.finished_at, record.outcome, record.error) == (T0 + 5, "released", None)
    assert (await event_data(backend, job.task_id, after=2)) == [
        ("status", {"status": "queued", "released": "worker shutdown"}),
    ]
    # The next claim is attempt 1 again, but with a new fence: the old one stays dead.
    again = await claim_one(backend, job.task_id, worker="w2", now=T0 + 6)
    assert (again.attempts, again.fence) == (1, 2)
    assert [h.attempt for h in again.history] == [1, 1]
    with pytest.raises(LeaseLostError):
        await backend.finish(job.task_id, job.fence, Complete(), now=T0 + 7)


@pytest.mark.parametrize("outcome", OUTCOMES, ids=OUTCOME_IDS)
@pytest.mark.parametrize("delta", [1, -1])
async def test_stale_fence_changes_nothing(backend: Backend, outcome: Outcome, delta: int) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError) as raised:
        await backend.finish(job.task_id, job.fence + delta, outcome, now=T0 + 5)
    assert (raised.value.task_id, raised.value.fence) == (job.task_id, job.fence + delta)
    assert await snapshot(backend, job.task_id) == before


@pytest.mark.parametrize("outcome", OUTCOMES, ids=OUTCOME_IDS)
@pytest.mark.parametrize("second", OUTCOMES, ids=OUTCOME_IDS)
async def test_finish_twice_fails_the_second_time(
    backend: Backend, outcome: Outcome, second: Outcome
) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.finish(job.task_id, job.fence, outcome, now=T0 + 5)
    after_first = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError):
        await backend.finish(job.task_id, job.fence, second, now=T0 + 6)
    assert await snapshot(backend, job.task_id) == after_first


@pytest.mark.parametrize("outcome", OUTCOMES, ids=OUTCOME_IDS)
async def test_finish_needs_a_claim(backend: Backend, outcome: Outcome) -> None:
    job = await drive(backend, JobStatus.QUEUED)
    before = await snapshot(backend, job.task_id)
    for fence in (0, 1):
        with pytest.raises(LeaseLostError):
            await backend.finish(job.task_id, fence, outcome, now=T0 + 5)
    assert await snapshot(backend, job.task_id) == before
    with pytest.raises(LeaseLostError):
        await backend.finish("task_missing", 1, outcome, now=T0 + 5)
    assert await backend.get("task_missing") is None


async def test_stale_fence_with_bad_result_raises_lease_lost(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError):
        await backend.finish(job.task_id, job.fence + 1, Complete(result=object()), now=T0 + 5)
    assert await snapshot(backend, job.task_id) == before


# -- only_if_lease_expired (the sweeper's guard) ------------------------------------------------


@pytest.mark.parametrize("outcome", OUTCOMES, ids=OUTCOME_IDS)
async def test_only_if_lease_expired_refuses_a_live_lease(
    backend: Backend, outcome: Outcome
) -> None:
    job = await drive(backend, JobStatus.PROCESSING)  # lease until T0 + 1 + LEASE
    assert job.lease_expires_at == T0 + 1 + LEASE
    before = await snapshot(backend, job.task_id)
    for now in (T0 + 2, T0 + LEASE):
        with pytest.raises(LeaseLostError):
            await backend.finish(
                job.task_id, job.fence, outcome, now=now, only_if_lease_expired=True
            )
    assert await snapshot(backend, job.task_id) == before


async def test_only_if_lease_expired_works_after_expiry(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    lost = error("lease_expired", "worker stopped renewing its lease")
    now = T0 + 1 + LEASE + 5
    requeued = await backend.finish(
        job.task_id, job.fence, RetryAt(lost, run_at=now), now=now, only_if_lease_expired=True
    )
    assert requeued.status == JobStatus.QUEUED and requeued.error == lost
    assert requeued.history[-1].outcome == "retry"
    # The owner's late write is refused now.
    with pytest.raises(LeaseLostError):
        await backend.finish(job.task_id, job.fence, Complete(result="late"), now=now + 1)


async def test_a_heartbeat_protects_the_lease_from_the_sweeper(backend: Backend) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    await backend.heartbeat(
        "w1", {job.task_id: job.fence}, now=T0 + 25, lease_s=LEASE
    )  # until T0 + 55
    before = await snapshot(backend, job.task_id)
    with pytest.raises(LeaseLostError):
        await backend.finish(
            job.task_id,
            job.fence,
            RetryAt(error(), run_at=T0 + 40),
            now=T0 + 40,
            only_if_lease_expired=True,
        )
    assert await snapshot(backend, job.task_id) == before
    failed = await backend.finish(
        job.task_id, job.fence, Fail(error(), ttl_s=TTL), now=T0 + 56, only_if_lease_expired=True
    )
    assert failed.status == JobStatus.FAILED and failed.expires_at == T0 + 56 + TTL


async def test_expired_leases_and_the_guard_agree_at_the_boundary(backend: Backend) -> None:
    """At now == lease_expires_at, a job is listed as expired iff the guard lets finish in."""
    job = await drive(backend, JobStatus.PROCESSING)
    boundary = job.lease_expires_at
    assert boundary is not None
    listed = [j.task_id for j in await backend.expired_leases(now=boundary, limit=10)]
    try:
        await backend.finish(
            job.task_id, job.fence, Release(), now=boundary, only_if_lease_expired=True
        )
        finished = True
    except LeaseLostError:
        finished = False
    assert (job.task_id in listed) == finished


@pytest.mark.parametrize(
    "result",
    [None, 0, -1.5, 1e300, 'text "quoted" é', [1, [2, {"a": None}]], {"": True, "k": "v"}],
    ids=["none", "zero", "float", "huge", "string", "list", "dict"],
)
async def test_complete_round_trips_any_json_result(backend: Backend, result: object) -> None:
    job = await drive(backend, JobStatus.PROCESSING)
    done = await backend.finish(job.task_id, job.fence, Complete(result=result), now=T0 + 5)
    stored = await backend.get(job.task_id)
    assert stored is not None
    assert done.result == stored.result == result
    assert (await event_data(backend, job.task_id))[-1] == (
        "status",
        {"status": "completed", "result": result},
    )


# -- finish(claimed=...): the worker's call, which a backend may answer without a read -------

EVERY_FIELD: dict[str, Any] = {
    "priority": 5,
    "metadata": {"user": "u-1", "tags": ["a", "b"], "n": 1.5},
    "webhook_url": "https://hooks.example.com/done?x=1",
    "webhook_progress": True,
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tenant": "acme",
    "parent_id": "task_parent",
    "idempotency_key": "key-1",
    "timeout_s": 90.0,
    "deadline_at": T0 + 500,
}

TERMINAL_OUTCOMES: list[Complete | Fail] = [
    Complete(result={"answer": [1, 2.5, "é"]}, usage={"input_tokens": 3, "output_tokens": 4}),
    Complete(result="text", usage={"input_tokens": 1, "model": "m-1", "cost": 0.25}),
    Complete(),
    Fail(error("bad_input", "cannot parse", retryable=False), ttl_s=7200.0),
]
TERMINAL_IDS = ["complete", "complete-usage-extras", "complete-bare", "fail"]


async def finish_claimed(backend: Backend, claimed: Job, outcome: Outcome, now: float) -> Job:
    """finish as the worker calls it; the Job it returns must be the one stored, exactly."""
    done = await backend.finish(claimed.task_id, claimed.fence, outcome, now=now, claimed=claimed)
    stored = await backend.get(claimed.task_id)
    assert stored is not None
    for name in Job.model_fields:
        assert getattr(done, name) == getattr(stored, name), name
    assert done == stored
    assert done.model_dump_json() == stored.model_dump_json()  # types too (100.0, not 100)
    return done


@pytest.mark.parametrize("outcome", TERMINAL_OUTCOMES, ids=TERMINAL_IDS)
@pytest.mark.parametrize(
    "progress",
    [None, Progress(percent=42.5, message="half way"), Progress(percent=10.0)],
    ids=["no-progress", "progress", "progress-without-message"],
)
@pytest.mark.parametrize("fields", [{}, EVERY_FIELD], ids=["plain", "every-field"])
async def test_finish_with_the_claimed_job_returns_it_as_stored(
    backend: Backend, outcome: Complete | Fail, progress: Progress | None, fields: dict[str, Any]
) -> None:
    claimed = await drive(backend, JobStatus.PROCESSING, **fields)
    if progress is not None:  # the handler reports progress after the claim
        first = Progress(percent=5.0, message="starting")
        await backend.append_event(
            claimed.task_id, claimed.fence, "progress", None, now=T0 + 2, progress=first
        )
        await backend.append_event(
            claimed.task_id, claimed.fence, "progress", {"n": 2}, now=T0 + 3, progress=progress
        )
    done = await finish_claimed(backend, claimed, outcome, T0 + 5.25)
    completed = isinstance(outcome, Complete)
    assert done.status == (JobStatus.COMPLETED if completed else JobStatus.FAILED)
    assert done.finished_at == T0 + 5.25 and done.lease_expires_at is None
    message = None if progress is None else progress.message
    percent = 100.0 if completed else (0.0 if progress is None else progress.percent)
    assert done.progress == Progress(percent=percent, message=message)
    last = done.history[-1]
    assert (last.finished_at, last.outcome) == (T0 + 5.25, done.status.value)


@pytest.mark.parametrize("outcome", TERMINAL_OUTCOMES, ids=TERMINAL_IDS)
async def test_finish_with_the_claimed_job_after_a_retry(
    backend: Backend, outcome: Complete | Fail
) -> None:
    job = await drive(backend, JobStatus.PROCESSING, **EVERY_FIELD)
    await backend.finish(job.task_id, job.fence, RetryAt(error(), run_at=T0 + 2), now=T0 + 2)
    again = await claim_one(backend, job.task_id, worker="w2", now=T0 + 3)
    assert again.error is not None and len(again.history) == 2
    done = await finish_claimed(backend, again, outcome, T0 + 4)
    assert [h.outcome for h in done.history] == ["retry", done.status.value]
    assert (await backend.events(job.task_id))[-1].seq == (7 if isinstance(outcome, Fail) else 6)


@pytest.mark.parametrize("outcome", TERMINAL_OUTCOMES, ids=TERMINAL_IDS)
async def test_finish_with_a_job_not_as_claimed_returns_it_as_stored(
    backend: Backend, outcome: Complete | Fail
) -> None:
    """A ``claimed`` that is not the claim being finished (another job's, or the job as it was
    queued) is no source for the job returned."""
    first = await enqueue(backend, **EVERY_FIELD)
    second = await enqueue(backend)
    claimed = await backend.claim("w1", limit=2, now=T0 + 1, lease_s=LEASE)
    assert [job.task_id for job in claimed] == [first.task_id, second.task_id]
    for job, wrong in ((claimed[0], first), (claimed[1], claimed[0])):
        done = await backend.finish(job.task_id, job.fence, outcome, now=T0 + 2, claimed=wrong)
        assert done == await backend.get(job.task_id)
        assert done.task_id == job.task_id and done.status.is_terminal
