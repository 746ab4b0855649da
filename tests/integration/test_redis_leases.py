"""The lease index of the Redis backend: whole-second scores, exact listing.

A small sorted set is one flat list in Redis, where an integer score is compared as is and a
fractional one is parsed from text at every step, so leases are scored by their end rounded
down to the second (redis_lua/prelude.lua lease_score); the sweeper's listing checks each
job's exact lease end.
"""

from __future__ import annotations

import dataclasses

from redis.asyncio import Redis

from backburner.backends.base import new_task_id
from backburner.backends.redis import RedisBackend

from ..conformance._support import T0, claim_one, new_job


async def test_leases_are_scored_in_whole_seconds_and_listed_by_their_exact_end(
    engine: RedisBackend, client: Redis
) -> None:
    # Two leases ending within one second: the index cannot tell them apart, the sweeper's
    # listing does. The one ending later sorts first among equal scores (by id).
    later_id, sooner_id = sorted(new_task_id() for _ in range(2))
    for task_id, claimed_at in ((later_id, T0 + 0.9), (sooner_id, T0 + 0.2)):
        await engine.enqueue(dataclasses.replace(new_job(now=T0), task_id=task_id))
        await claim_one(engine, task_id, now=claimed_at, lease_s=30)
    leases = f"{{{engine.prefix}}}:leases"
    scores = dict(await client.zrange(leases, 0, -1, withscores=True))
    assert scores == {later_id.encode(): T0 + 30, sooner_id.encode(): T0 + 30}

    assert await engine.expired_leases(now=T0 + 30.1, limit=10) == []
    (expired,) = await engine.expired_leases(now=T0 + 30.5, limit=1)  # past the later one
    assert expired.task_id == sooner_id and expired.lease_expires_at == T0 + 30.2
    both = await engine.expired_leases(now=T0 + 30.9, limit=10)
    assert [job.task_id for job in both] == [later_id, sooner_id]


async def test_a_renewed_lease_is_scored_by_its_new_end_rounded_down(
    engine: RedisBackend, client: Redis
) -> None:
    job, _ = await engine.enqueue(new_job(now=T0))
    claimed = await claim_one(engine, job.task_id, now=T0, lease_s=30)
    await engine.heartbeat("w1", {job.task_id: claimed.fence}, now=T0 + 10.7, lease_s=30)
    assert await client.zscore(f"{{{engine.prefix}}}:leases", job.task_id) == T0 + 40
    assert await engine.expired_leases(now=T0 + 40.5, limit=10) == []
    (expired,) = await engine.expired_leases(now=T0 + 40.7, limit=10)
    assert expired.task_id == job.task_id


async def test_an_exact_score_written_by_an_earlier_release_is_listed_from_its_exact_end(
    engine: RedisBackend, client: Redis
) -> None:
    job, _ = await engine.enqueue(new_job(now=T0 - 20))
    await claim_one(engine, job.task_id, now=T0 - 19.5, lease_s=30)  # ends at T0 + 10.5
    await client.zadd(f"{{{engine.prefix}}}:leases", {job.task_id: T0 + 10.5})  # as it wrote
    assert await engine.expired_leases(now=T0 + 10.4, limit=10) == []
    for now in (T0 + 10.5, T0 + 11.2):  # within its second, and after it
        (expired,) = await engine.expired_leases(now=now, limit=10)
        assert expired.task_id == job.task_id
