"""The scripts run as one Redis Functions library (FCALL) where Redis has Functions; a Redis
that lost the library gets it again, and one without Functions runs the same scripts by
EVALSHA."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from backburner.backends.base import Complete
from backburner.backends.redis import RedisBackend, delete_all_keys
from backburner.backends.redis_link import RedisLink
from backburner.backends.redis_scripts import MAX_PREFIXES
from backburner.errors import BackendError
from backburner.models import JobStatus

from ..chaos.support import RedisServer, started_redis
from ..conformance._support import T0, claim_one, enqueue, new_job
from ..conftest import REDIS_TEST_URL, require_redis
from ..helpers import eventually


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every command the backends' links send (the first words of each)."""
    commands: list[tuple[Any, ...]] = []
    call = RedisLink.call

    async def spy(self: RedisLink, *args: Any, **options: bool) -> Any:
        commands.append(args[:2])
        return await call(self, *args, **options)

    monkeypatch.setattr(RedisLink, "call", spy)
    return commands


@pytest.fixture
def redis_without_functions(tmp_path: Path) -> Iterator[RedisServer]:
    """As Redis 6, or a managed Redis that does not offer them: no FUNCTION, no FCALL."""
    yield from started_redis(
        tmp_path, "--rename-command", "FUNCTION", "", "--rename-command", "FCALL", ""
    )


async def round_trip(engine: RedisBackend) -> None:
    """Enqueue, claim and complete a job; it reads back completed."""
    job = await enqueue(engine)
    claimed = await claim_one(engine, job.task_id, now=T0 + 1)
    await engine.finish(job.task_id, claimed.fence, Complete({"ok": 1}), now=T0 + 2)
    done = await engine.get(job.task_id)
    assert done is not None and done.status is JobStatus.COMPLETED and done.result == {"ok": 1}


def scripts_sent(sent: list[tuple[Any, ...]]) -> set[str]:
    return {args[0] for args in sent if args[0] in ("FCALL", "EVALSHA")}


@pytest.fixture
async def shared_engine() -> AsyncIterator[RedisBackend]:
    require_redis()
    engine = RedisBackend(REDIS_TEST_URL, prefix="test-" + uuid.uuid4().hex[:12])
    yield engine
    await engine.close()
    await delete_all_keys(REDIS_TEST_URL, engine.prefix)


async def test_the_scripts_run_as_the_functions_of_one_library(
    shared_engine: RedisBackend, sent: list[tuple[Any, ...]]
) -> None:
    await shared_engine.connect()  # (a new store: the layout's one-off upgrade script, by EVALSHA)
    sent.clear()
    await round_trip(shared_engine)
    assert scripts_sent(sent) == {"FCALL"}
    client = Redis.from_url(REDIS_TEST_URL)
    try:
        library = shared_engine._library
        listed = await client.function_list(library=library.name)
    finally:
        await client.aclose()
    assert len(listed) == 1, listed
    entry = dict(zip(listed[0][::2], listed[0][1::2], strict=True))
    names = {dict(zip(f[::2], f[1::2], strict=True))[b"name"].decode() for f in entry[b"functions"]}
    assert names == {library.function_name(s) for s in library.scripts}


async def test_functions_false_runs_the_scripts_by_evalsha(sent: list[tuple[Any, ...]]) -> None:
    require_redis()
    engine = RedisBackend(REDIS_TEST_URL, prefix="test-" + uuid.uuid4().hex[:12], functions=False)
    await engine.connect()
    try:
        await round_trip(engine)
    finally:
        await engine.close()
        await delete_all_keys(REDIS_TEST_URL, engine.prefix)
    assert scripts_sent(sent) == {"EVALSHA"}
    assert not [args for args in sent if args[0] == "FUNCTION"]


async def test_a_redis_without_functions_runs_the_scripts_by_evalsha(
    redis_without_functions: RedisServer, sent: list[tuple[Any, ...]]
) -> None:
    engine = RedisBackend(f"redis://127.0.0.1:{redis_without_functions.port}/0", prefix="nofn")
    await engine.connect()
    try:
        await round_trip(engine)
    finally:
        await engine.close()
    assert scripts_sent(sent) == {"EVALSHA"}


async def test_a_redis_that_lost_the_library_loads_it_again(
    own_redis: RedisServer, sent: list[tuple[Any, ...]]
) -> None:
    engine = RedisBackend(f"redis://127.0.0.1:{own_redis.port}/0", prefix="lost")
    client = Redis(port=own_redis.port)
    await engine.connect()
    try:
        before = await enqueue(engine)
        assert await client.function_flush() is True  # as a restart without persistence
        after = await enqueue(engine)  # refused once ("Function not found"), loaded, sent again
        assert [args[0] for args in sent if args[0] != "GET"][-3:] == ["FCALL", "FUNCTION", "FCALL"]
        # Then whether Redis kept the keys too is asked (it did: nothing is reported).
        await eventually(lambda: ("GET", "{lost}:layout") in sent, message="the store checked")
        assert await client.function_list(library=engine._library.name)
        for job in (before, after):
            stored = await engine.get(job.task_id)
            assert stored is not None and stored.status is JobStatus.QUEUED
        claimed = await engine.claim("w1", limit=10, now=T0 + 1, lease_s=30)
        assert sorted(j.task_id for j in claimed) == sorted([before.task_id, after.task_id])
    finally:
        await engine.close()
        await client.aclose()


async def test_prefixes_beyond_the_librarys_cache_keep_their_keys_apart(
    own_redis: RedisServer,
) -> None:
    # The library builds its helpers once per prefix and starts over past MAX_PREFIXES; each
    # prefix's calls must go on touching only its own keys, before that and after.
    url = f"redis://127.0.0.1:{own_redis.port}/0"
    engines = [RedisBackend(url, prefix=f"p{i}") for i in range(MAX_PREFIXES + 3)]
    try:
        for engine in engines:
            await engine.connect()
            job, created = await engine.enqueue(replace(new_job(), task_id="same"))
            assert created and job.task_id == "same"
        for engine in engines:  # the cache was started over: the first prefixes are built again
            with pytest.raises(BackendError, match="already exists"):
                await engine.enqueue(replace(new_job(), task_id="same"))
            claimed = await engine.claim("w1", limit=5, now=T0 + 1, lease_s=30)
            assert [j.task_id for j in claimed] == ["same"]
    finally:
        for engine in engines:
            await engine.close()
