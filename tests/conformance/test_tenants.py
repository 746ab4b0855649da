"""Tenants in the backend: the tenant a job carries, the quota enqueue checks atomically, the
per-minute bucket, per-tenant listing, and weighted fair order within a priority."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backburner.backends import Backend
from backburner.backends.base import (
    Complete,
    Fail,
    Quota,
    Release,
    RetryAt,
    check_tenant,
    fair_cost,
)
from backburner.errors import (
    IdempotencyConflictError,
    InvalidInputError,
    QuotaExceededError,
    SubmitRateLimitedError,
)
from backburner.models import Job, JobStatus

from ._support import LEASE, T0, TTL, claim_one, enqueue, error, new_job, peer


async def tenant_job(
    backend: Backend, tenant: str, *, quota: Quota | None = None, **kwargs: Any
) -> Job:
    job, created = await backend.enqueue(new_job(tenant=tenant, **kwargs), quota=quota)
    assert created is True
    return job


async def picks(backend: Backend, count: int, *, now: float = T0) -> list[Job]:
    """Claim ``count`` jobs one at a time (the order a single-slot worker would start them)."""
    return [await claim_one(backend, now=now) for _ in range(count)]


# -- the tenant a job carries ----------------------------------------------------------------


async def test_a_job_keeps_its_tenant(backend: Backend) -> None:
    job = await tenant_job(backend, "acme")
    assert job.tenant == "acme"
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.tenant == "acme"
    claimed = await claim_one(backend, job.task_id)
    assert claimed.tenant == "acme"
    plain = await enqueue(backend)
    assert plain.tenant == "default"


def test_tenant_names_and_weights_are_checked() -> None:
    assert check_tenant("acme-corp.eu:team@1") == "acme-corp.eu:team@1"
    for bad in ["", " acme", "-x", "a" * 65, "a b", "a/b", "ümlaut"]:
        with pytest.raises(InvalidInputError):
            check_tenant(bad)
    assert fair_cost(1) == 10_000
    assert fair_cost(4) == 2_500
    assert fair_cost(100) == 100 and fair_cost(0.01) == 1_000_000
    for bad_weight in [0, -1, 0.001, 101, float("nan"), float("inf"), True]:
        with pytest.raises(InvalidInputError):
            fair_cost(bad_weight)  # type: ignore[arg-type]


# -- jobs in flight ---------------------------------------------------------------------------


async def test_the_in_flight_count_follows_every_transition(backend: Backend) -> None:
    async def count() -> int:
        return await backend.tenant_in_flight("acme")

    assert await count() == 0
    done = await tenant_job(backend, "acme")
    failing = await tenant_job(backend, "acme")
    retried = await tenant_job(backend, "acme")
    cancelled_queued = await tenant_job(backend, "acme")
    cancelled_running = await tenant_job(backend, "acme")
    await tenant_job(backend, "acme", run_at=T0 + 600)  # delayed jobs count too
    assert await count() == 6
    jobs = {j.task_id: j for j in await backend.claim("w1", limit=5, now=T0, lease_s=LEASE)}
    await tenant_job(backend, "other")
    assert set(jobs) == {
        done.task_id,
        failing.task_id,
        retried.task_id,
        cancelled_queued.task_id,
        cancelled_running.task_id,
    }
    assert await count() == 6
    await backend.finish(done.task_id, jobs[done.task_id].fence, Complete(1), now=T0 + 1)
    assert await count() == 5
    await backend.finish(
        failing.task_id, jobs[failing.task_id].fence, Fail(error(), ttl_s=TTL), now=T0 + 1
    )
    assert await count() == 4
    await backend.finish(
        retried.task_id, jobs[retried.task_id].fence, RetryAt(error(), T0 + 5), now=T0 + 1
    )
    assert await count() == 4
    await backend.cancel(cancelled_running.task_id, now=T0 + 1)
    assert await count() == 3
    # cancelled_queued was claimed above; put it back first, then cancel it while queued.
    await backend.finish(
        cancelled_queued.task_id, jobs[cancelled_queued.task_id].fence, Release(), now=T0 + 1
    )
    assert await count() == 3
    await backend.cancel(cancelled_queued.task_id, now=T0 + 1)
    assert await count() == 2
    await backend.cancel(cancelled_queued.task_id, now=T0 + 2)  # already terminal: no change
    assert await count() == 2
    await backend.replay(failing.task_id, now=T0 + 3, extra_attempts=1)
    assert await count() == 3
    assert await backend.delete(done.task_id) is True
    assert await count() == 3
    assert await backend.tenant_in_flight("other") == 1
    assert await backend.tenant_in_flight("nobody") == 0


async def test_the_quota_refuses_the_job_past_max_in_flight(backend: Backend) -> None:
    quota = Quota(max_in_flight=3)
    first = [await tenant_job(backend, "acme", quota=quota) for _ in range(3)]
    with pytest.raises(QuotaExceededError) as refused:
        await backend.enqueue(new_job(tenant="acme", payload={"n": 4}), quota=quota)
    assert refused.value.tenant == "acme" and refused.value.limit == 3
    assert refused.value.retry_after is None
    page = await backend.list_jobs(tenant="acme")
    assert {j.task_id for j in page.jobs} == {j.task_id for j in first}
    # Another tenant has its own count; a submission without a quota is not limited.
    await tenant_job(backend, "globex", quota=quota)
    await tenant_job(backend, "acme")
    assert await backend.tenant_in_flight("acme") == 4
    # A finished job frees its place.
    claimed = await backend.claim("w1", limit=1, now=T0, lease_s=LEASE)
    await backend.finish(claimed[0].task_id, claimed[0].fence, Complete(None), now=T0 + 1)
    with pytest.raises(QuotaExceededError):
        await backend.enqueue(new_job(tenant="acme"), quota=quota)
    await backend.cancel(first[1].task_id, now=T0 + 1)
    await backend.cancel(first[2].task_id, now=T0 + 1)
    await tenant_job(backend, "acme", quota=quota)


async def test_a_refused_job_leaves_nothing_behind(backend: Backend) -> None:
    quota = Quota(max_in_flight=1)
    held = await tenant_job(backend, "acme", quota=quota)
    refused = new_job(tenant="acme", idempotency_key="order-7")
    with pytest.raises(QuotaExceededError):
        await backend.enqueue(refused, quota=quota)
    assert await backend.get(refused.task_id) is None
    assert await backend.events(refused.task_id) == []
    await backend.cancel(held.task_id, now=T0)
    # The key was not taken by the refused job: the same request goes through now.
    job, created = await backend.enqueue(refused, quota=quota)
    assert created is True and job.task_id == refused.task_id


async def test_a_repeated_idempotent_submission_is_answered_at_the_quota(backend: Backend) -> None:
    quota = Quota(max_in_flight=1, per_minute=1)
    original = new_job(tenant="acme", idempotency_key="k1")
    await backend.enqueue(original, quota=quota)
    again, created = await backend.enqueue(
        new_job(tenant="acme", idempotency_key="k1"), quota=quota
    )
    assert created is False and again.task_id == original.task_id
    with pytest.raises(IdempotencyConflictError):
        await backend.enqueue(
            new_job(tenant="acme", idempotency_key="k1", payload={"other": 1}), quota=quota
        )


async def test_concurrent_submissions_never_overshoot_the_quota(backend: Backend) -> None:
    quota = Quota(max_in_flight=7)
    async with peer(backend) as other:

        async def submit(i: int) -> bool:
            engine = backend if i % 2 else other
            try:
                await engine.enqueue(new_job(tenant="acme", payload={"i": i}), quota=quota)
            except QuotaExceededError:
                return False
            return True

        accepted = await asyncio.gather(*(submit(i) for i in range(40)))
    assert sum(accepted) == 7
    assert await backend.tenant_in_flight("acme") == 7
    assert len((await backend.list_jobs(tenant="acme", limit=100)).jobs) == 7


# -- submissions per minute -------------------------------------------------------------------


async def test_the_per_minute_bucket_refills_continuously(backend: Backend) -> None:
    quota = Quota(per_minute=3)
    for _ in range(3):
        await tenant_job(backend, "acme", quota=quota, now=T0)
    with pytest.raises(SubmitRateLimitedError) as refused:
        await backend.enqueue(new_job(tenant="acme", now=T0), quota=quota)
    assert refused.value.per_minute == 3
    assert refused.value.retry_after == pytest.approx(20.0, abs=1e-3)
    with pytest.raises(SubmitRateLimitedError) as later:
        await backend.enqueue(new_job(tenant="acme", now=T0 + 15), quota=quota)
    assert later.value.retry_after == pytest.approx(5.0, abs=1e-3)
    await tenant_job(backend, "acme", quota=quota, now=T0 + 20)
    with pytest.raises(SubmitRateLimitedError):
        await backend.enqueue(new_job(tenant="acme", now=T0 + 20), quota=quota)
    # Each tenant has its own bucket; a minute of quiet fills it again, no further.
    await tenant_job(backend, "globex", quota=quota, now=T0)
    for _ in range(3):
        await tenant_job(backend, "acme", quota=quota, now=T0 + 500)
    with pytest.raises(SubmitRateLimitedError):
        await backend.enqueue(new_job(tenant="acme", now=T0 + 500), quota=quota)


async def test_only_a_stored_job_takes_a_token(backend: Backend) -> None:
    held = await tenant_job(backend, "acme", quota=Quota(max_in_flight=1))
    quota = Quota(max_in_flight=1, per_minute=2)
    for _ in range(5):
        with pytest.raises(QuotaExceededError):
            await backend.enqueue(new_job(tenant="acme"), quota=quota)
    await backend.cancel(held.task_id, now=T0)
    await tenant_job(backend, "acme", quota=quota)
    # The refusals took no token: the bucket of two still has one.
    await tenant_job(backend, "acme", quota=Quota(per_minute=2))
    with pytest.raises(SubmitRateLimitedError):
        await backend.enqueue(new_job(tenant="acme"), quota=Quota(per_minute=2))


# -- listing ----------------------------------------------------------------------------------


async def test_listing_by_tenant(backend: Backend) -> None:
    acme = [await tenant_job(backend, "acme", payload={"i": i}) for i in range(5)]
    await tenant_job(backend, "globex")
    await enqueue(backend)
    first = await backend.list_jobs(tenant="acme", limit=3)
    assert [j.task_id for j in first.jobs] == [j.task_id for j in reversed(acme)][:3]
    assert first.next_cursor is not None
    rest = await backend.list_jobs(tenant="acme", limit=3, cursor=first.next_cursor)
    assert [j.task_id for j in rest.jobs] == [acme[1].task_id, acme[0].task_id]
    assert rest.next_cursor is None
    claimed = await claim_one(backend, acme[0].task_id)
    await backend.finish(claimed.task_id, claimed.fence, Complete(1), now=T0 + 1)
    done = await backend.list_jobs(tenant="acme", status=JobStatus.COMPLETED)
    assert [j.task_id for j in done.jobs] == [acme[0].task_id]
    assert (await backend.list_jobs(tenant="globex", status=JobStatus.COMPLETED)).jobs == []
    assert (await backend.list_jobs(tenant="nobody")).jobs == []
    assert len((await backend.list_jobs(limit=100)).jobs) == 7


async def test_listing_by_tenant_and_type(backend: Backend) -> None:
    wanted = await tenant_job(backend, "acme", task_type="translate")
    await tenant_job(backend, "acme", task_type="summarize")
    await tenant_job(backend, "globex", task_type="translate")
    page = await backend.list_jobs(tenant="acme", type="translate")
    assert [j.task_id for j in page.jobs] == [wanted.task_id]


async def test_deleted_and_expired_jobs_leave_the_tenant_listing(backend: Backend) -> None:
    gone = await tenant_job(backend, "acme", ttl_s=10)
    kept = await tenant_job(backend, "acme")
    await backend.cancel(gone.task_id, now=T0)
    await backend.cancel(kept.task_id, now=T0 + 100)
    assert await backend.purge_expired(now=T0 + 50, limit=10) == 1
    page = await backend.list_jobs(tenant="acme")
    assert [j.task_id for j in page.jobs] == [kept.task_id]
    assert await backend.delete(kept.task_id) is True
    assert (await backend.list_jobs(tenant="acme")).jobs == []


# -- fair order -------------------------------------------------------------------------------


async def test_a_small_tenant_is_not_starved_by_a_big_backlog(backend: Backend) -> None:
    big = [await tenant_job(backend, "big", payload={"i": i}) for i in range(60)]
    small = [await tenant_job(backend, "small", payload={"i": i}) for i in range(10)]
    order = [j.task_id for j in await picks(backend, 20)]
    expected = [job.task_id for pair in zip(big[:10], small, strict=True) for job in pair]
    assert order == expected


async def test_one_claim_of_many_jobs_interleaves_tenants_too(backend: Backend) -> None:
    big = [await tenant_job(backend, "big", payload={"i": i}) for i in range(60)]
    small = [await tenant_job(backend, "small", payload={"i": i}) for i in range(5)]
    claimed = await backend.claim("w1", limit=12, now=T0, lease_s=LEASE)
    expected = [j.task_id for pair in zip(big[:5], small, strict=True) for j in pair]
    assert [j.task_id for j in claimed] == [*expected, big[5].task_id, big[6].task_id]


async def test_every_one_of_many_tenants_gets_a_turn(backend: Backend) -> None:
    for i in range(30):
        await tenant_job(backend, "big", payload={"i": i})
    singles = [await tenant_job(backend, f"t{i}") for i in range(15)]
    first = {j.task_id for j in await backend.claim("w1", limit=30, now=T0, lease_s=LEASE)}
    assert {j.task_id for j in singles} <= first


async def test_weights_share_the_starts(backend: Backend) -> None:
    for i in range(60):
        await tenant_job(backend, "heavy", payload={"i": i}, fair_cost=fair_cost(3))
        await tenant_job(backend, "light", payload={"i": i}, fair_cost=fair_cost(1))
    tenants = [j.tenant for j in await backend.claim("w1", limit=40, now=T0, lease_s=LEASE)]
    assert 29 <= tenants.count("heavy") <= 31


async def test_an_idle_tenant_gets_no_credit_for_its_idleness(backend: Backend) -> None:
    busy = [await tenant_job(backend, "busy", payload={"i": i}) for i in range(30)]
    first = await picks(backend, 10)
    assert [j.task_id for j in first] == [j.task_id for j in busy[:10]]
    late = [await tenant_job(backend, "late", payload={"i": i}) for i in range(10)]
    order = [j.task_id for j in await picks(backend, 20)]
    expected = [job.task_id for pair in zip(busy[10:20], late, strict=True) for job in pair]
    assert order == expected


async def test_a_cancelled_backlog_does_not_hold_its_tenant_back(backend: Backend) -> None:
    # Cancelled newest first (as a batch's cancel goes), its jobs leave its line: its next
    # job waits behind at most one of each other tenant's, as if the backlog had never been.
    backlog = [await tenant_job(backend, "flaky", payload={"i": i}) for i in range(40)]
    for job in reversed(backlog):
        await backend.cancel(job.task_id, now=T0 + 1)
    steady = [await tenant_job(backend, "steady", payload={"i": i}) for i in range(40)]
    fresh = await tenant_job(backend, "flaky", payload={"i": "fresh"})
    order = [j.task_id for j in await picks(backend, 3, now=T0 + 2)]
    assert order[:2] == [steady[0].task_id, fresh.task_id]


async def test_a_tenants_jobs_stay_fifo_whichever_of_them_are_cancelled(
    backend: Backend,
) -> None:
    line = [await tenant_job(backend, "a", payload={"i": i}) for i in range(5)]
    for job in line[:3]:  # the oldest: its newer jobs keep their places
        await backend.cancel(job.task_id, now=T0 + 1)
    await backend.cancel(line[4].task_id, now=T0 + 1)  # the newest: it leaves the line
    late = await tenant_job(backend, "a", payload={"i": "late"})
    order = [j.task_id for j in await picks(backend, 2, now=T0 + 2)]
    assert order == [line[3].task_id, late.task_id]


async def test_priority_comes_before_fairness(backend: Backend) -> None:
    for i in range(10):
        await tenant_job(backend, "big", payload={"i": i}, priority=5)
    low = await tenant_job(backend, "small")
    urgent = await tenant_job(backend, "small", priority=9)
    claimed = [j.task_id for j in await backend.claim("w1", limit=12, now=T0, lease_s=LEASE)]
    assert claimed[0] == urgent.task_id
    assert claimed[-1] == low.task_id


async def test_fairness_holds_across_task_types(backend: Backend) -> None:
    for i in range(20):
        await tenant_job(backend, "big", task_type="x", payload={"i": i})
    small = [await tenant_job(backend, "small", task_type="y", payload={"i": i}) for i in range(5)]
    claimed = await backend.claim("w1", limit=10, now=T0, lease_s=LEASE, types=["x", "y"])
    assert {j.task_id for j in small} <= {j.task_id for j in claimed}


async def test_a_delayed_job_joins_its_tenants_line_when_due(backend: Backend) -> None:
    delayed = await tenant_job(backend, "acme", run_at=T0 + 10)
    now_jobs = [await tenant_job(backend, "acme", payload={"i": i}) for i in range(3)]
    order = [j.task_id for j in await picks(backend, 4, now=T0 + 10)]
    assert order == [j.task_id for j in now_jobs] + [delayed.task_id]


async def test_a_retried_job_joins_the_back_of_its_tenants_line(backend: Backend) -> None:
    jobs = [await tenant_job(backend, "acme", payload={"i": i}) for i in range(3)]
    first = await claim_one(backend, jobs[0].task_id)
    await backend.finish(first.task_id, first.fence, RetryAt(error(), T0), now=T0)
    order = [j.task_id for j in await picks(backend, 3, now=T0 + 1)]
    assert order == [jobs[1].task_id, jobs[2].task_id, jobs[0].task_id]


async def test_a_released_job_keeps_its_place(backend: Backend) -> None:
    jobs = [await tenant_job(backend, "acme", payload={"i": i}) for i in range(3)]
    first = await claim_one(backend, jobs[0].task_id)
    await backend.finish(first.task_id, first.fence, Release(), now=T0 + 1)
    order = [j.task_id for j in await picks(backend, 3, now=T0 + 1)]
    assert order == [j.task_id for j in jobs]


async def test_a_replayed_job_joins_its_tenants_line_again(backend: Backend) -> None:
    failed = await tenant_job(backend, "acme")
    claimed = await claim_one(backend, failed.task_id)
    await backend.finish(failed.task_id, claimed.fence, Fail(error(), ttl_s=TTL), now=T0)
    others = [await tenant_job(backend, "acme", payload={"i": i}) for i in range(2)]
    await backend.replay(failed.task_id, now=T0 + 1, extra_attempts=1)
    order = [j.task_id for j in await picks(backend, 3, now=T0 + 1)]
    assert order == [others[0].task_id, others[1].task_id, failed.task_id]


async def test_fair_order_survives_a_second_connection(backend: Backend) -> None:
    big = [await tenant_job(backend, "big", payload={"i": i}) for i in range(10)]
    async with peer(backend) as other:
        small, _ = await other.enqueue(new_job(tenant="small"))
        claimed = await other.claim("w2", limit=2, now=T0, lease_s=LEASE)
    assert [j.task_id for j in claimed] == [big[0].task_id, small.task_id]


async def test_workers_of_one_type_do_not_push_back_another_types_tenants(
    backend: Backend,
) -> None:
    for i in range(30):
        await tenant_job(backend, "big", task_type="gen", payload={"i": i})
    for i in range(30):
        await tenant_job(backend, "embedder", task_type="embed", payload={"i": i})
    drained = await backend.claim("w1", limit=30, now=T0, lease_s=LEASE, types=["embed"])
    assert len(drained) == 30
    late = await tenant_job(backend, "small", task_type="gen")
    first = await backend.claim("w2", limit=2, now=T0, lease_s=LEASE, types=["gen"])
    assert late.task_id in {j.task_id for j in first}


async def test_a_new_type_starts_level_with_the_others(backend: Backend) -> None:
    old = [await tenant_job(backend, "acme", task_type="x", payload={"i": i}) for i in range(20)]
    assert len(await backend.claim("w1", limit=10, now=T0, lease_s=LEASE, types=["x"])) == 10
    new = [await tenant_job(backend, "acme", task_type="y", payload={"i": i}) for i in range(5)]
    claimed = await backend.claim("w1", limit=4, now=T0, lease_s=LEASE, types=["x", "y"])
    assert [j.task_id for j in claimed] == [
        old[10].task_id,
        new[0].task_id,
        old[11].task_id,
        new[1].task_id,
    ]


async def test_a_type_idle_for_a_while_does_not_go_ahead_of_the_others(backend: Backend) -> None:
    # The review's repro: a type's clock stood still while another's moved on; a backlog of
    # that type then went ahead of every job of the other, as if its clock were level.
    await tenant_job(backend, "small", task_type="rare")
    for i in range(30):
        await tenant_job(backend, "small", task_type="busy", payload={"i": i})
    assert len(await backend.claim("w1", limit=31, now=T0, lease_s=LEASE)) == 31
    flood = [
        await tenant_job(backend, "big", task_type="rare", payload={"i": i}) for i in range(20)
    ]
    late = await tenant_job(backend, "small", task_type="busy")
    order = [j.task_id for j in await picks(backend, 3)]
    assert order == [flood[0].task_id, late.task_id, flood[1].task_id]


async def test_a_replay_past_the_quota_is_refused(backend: Backend) -> None:
    failed = await tenant_job(backend, "acme")
    claimed = await claim_one(backend, failed.task_id)
    await backend.finish(failed.task_id, claimed.fence, Fail(error(), ttl_s=TTL), now=T0)
    await tenant_job(backend, "acme")
    with pytest.raises(QuotaExceededError):
        await backend.replay(
            failed.task_id, now=T0 + 1, extra_attempts=1, quota=Quota(max_in_flight=1)
        )
    stored = await backend.get(failed.task_id)
    assert stored is not None and stored.status == JobStatus.FAILED
    assert await backend.tenant_in_flight("acme") == 1
    replayed = await backend.replay(
        failed.task_id, now=T0 + 1, extra_attempts=1, quota=Quota(max_in_flight=2)
    )
    assert replayed.status == JobStatus.QUEUED


async def test_a_childs_replay_is_not_held_to_the_quota(backend: Backend) -> None:
    # Children are their parent's work, not submissions: they are not counted in flight, so
    # the replay of a failed one is not refused while the parent fills the tenant's quota.
    parent = await tenant_job(backend, "acme", run_at=T0 + 600)  # (queued, not due)
    child = await tenant_job(backend, "acme", parent_id=parent.task_id)
    claimed = await claim_one(backend, child.task_id)
    await backend.finish(child.task_id, claimed.fence, Fail(error(), ttl_s=TTL), now=T0)
    assert await backend.tenant_in_flight("acme") == 1
    replayed = await backend.replay(
        child.task_id, now=T0 + 1, extra_attempts=1, quota=Quota(max_in_flight=1)
    )
    assert replayed.status == JobStatus.QUEUED
    assert await backend.tenant_in_flight("acme") == 1
