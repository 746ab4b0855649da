"""Bad input gets a typed exception with a clear message, and nothing is stored."""

from __future__ import annotations

import asyncio
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, JobContext, Retry, Settings
from backburner.backends import Backend
from backburner.errors import (
    BackendError,
    ConfigurationError,
    IdempotencyConflictError,
    InvalidInputError,
    JobNotFoundError,
    QueueFullError,
    UnknownTaskError,
)
from backburner.models import JobStatus


def make_app(backend: Backend) -> Backburner:
    bb = Backburner(backend, settings=Settings(backend_url="memory://"))

    @bb.task
    async def summarize(ctx: JobContext, text: str, words: int = 10) -> str:
        return text

    @bb.task
    async def anything(ctx: JobContext, **options: Any) -> None:
        return None

    @bb.task
    async def positional(ctx: JobContext, a: int, /) -> None:
        return None

    return bb


BAD_ENQUEUES: list[tuple[str, Any, dict[str, Any], type[Exception], str]] = [
    ("nope", {}, {}, UnknownTaskError, "unknown task 'nope'"),
    ("summarize", {"text": {1, 2}}, {}, InvalidInputError, "not JSON-serialisable"),
    ("summarize", {"text": math.nan}, {}, InvalidInputError, "not JSON-serialisable"),
    ("summarize", ["text"], {}, InvalidInputError, "must be a JSON object"),
    ("summarize", {}, {}, InvalidInputError, "missing a required argument: 'text'"),
    ("summarize", {"text": "x", "other": 1}, {}, InvalidInputError, "unexpected keyword"),
    ("summarize", {"text": "x", "ctx": 1}, {}, InvalidInputError, "multiple values for"),
    ("anything", {"ctx": 1}, {}, InvalidInputError, "'ctx' cannot be passed by keyword"),
    ("positional", {"a": 1}, {}, InvalidInputError, "positional"),
    ("positional", {}, {}, InvalidInputError, "missing a required argument"),
    ("summarize", {"text": "x"}, {"timeout": math.inf}, InvalidInputError, "timeout must be"),
    ("summarize", {"text": "x"}, {"priority": 101}, InvalidInputError, "-100..100"),
    ("summarize", {"text": "x"}, {"priority": 2.5}, InvalidInputError, "must be an integer"),
    ("summarize", {"text": "x"}, {"priority": "high"}, InvalidInputError, "priority class"),
    ("summarize", {"text": "x"}, {"tenant": "a b"}, InvalidInputError, "tenant name"),
    ("summarize", {"text": "x"}, {"priority": True}, InvalidInputError, "must be an integer"),
    ("summarize", {"text": "x"}, {"ttl": 0}, InvalidInputError, "ttl must be a positive"),
    ("summarize", {"text": "x"}, {"ttl": -5}, InvalidInputError, "ttl must be a positive"),
    ("summarize", {"text": "x"}, {"timeout": 0}, InvalidInputError, "timeout must be"),
    ("summarize", {"text": "x"}, {"timeout": math.nan}, InvalidInputError, "timeout must be"),
    ("summarize", {"text": "x"}, {"ttl": True}, InvalidInputError, "ttl must be a positive"),
    ("summarize", {"text": "x"}, {"ttl": "60"}, InvalidInputError, "ttl must be a positive"),
    ("summarize", {"text": "x"}, {"tenant": 7}, InvalidInputError, "tenant name"),
    ("summarize", {"text": "x"}, {"max_attempts": 0}, InvalidInputError, "max_attempts"),
    ("summarize", {"text": "x"}, {"delay": -1}, InvalidInputError, "delay must be"),
    ("summarize", {"text": "x"}, {"delay": 1, "run_at": 5.0}, InvalidInputError, "not both"),
    ("summarize", {"text": "x"}, {"idempotency_key": ""}, InvalidInputError, "idempotency_key"),
    # A lone surrogate is not Unicode: SQLite refused it untyped, the memory backend kept it.
    ("summarize", {"text": "x"}, {"idempotency_key": "k\ud800"}, InvalidInputError, "surrogate"),
    ("summarize", {"text": "x"}, {"webhook_url": "https://h/\udfff"}, InvalidInputError, "webhook"),
    ("summarize", {"text": "x"}, {"metadata": "m"}, InvalidInputError, "metadata must be"),
    ("summarize", {"text": "x"}, {"webhook_url": "ftp://x"}, InvalidInputError, "webhook_url"),
]


@pytest.mark.parametrize(("task", "payload", "options", "error", "message"), BAD_ENQUEUES)
async def test_bad_enqueue_is_refused_and_nothing_stored(
    backend: Backend,
    task: str,
    payload: Any,
    options: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    bb = make_app(backend)
    with pytest.raises(error) as caught:
        await bb.enqueue(task, payload, **options)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert (await bb.list()).jobs == []


async def test_idempotency_key_reuse(backend: Backend) -> None:
    bb = make_app(backend)
    first = await bb.enqueue("summarize", {"text": "a"}, idempotency_key="k")
    again = await bb.enqueue("summarize", {"text": "a"}, idempotency_key="k")
    assert again.task_id == first.task_id
    with pytest.raises(IdempotencyConflictError, match="already used by job"):
        await bb.enqueue("summarize", {"text": "b"}, idempotency_key="k")
    assert len((await bb.list()).jobs) == 1


async def test_100_concurrent_enqueues_with_one_key_make_one_job(backend: Backend) -> None:
    bb = make_app(backend)
    jobs = await asyncio.gather(
        *[bb.enqueue("summarize", {"text": "a"}, idempotency_key="same") for _ in range(100)]
    )
    assert len({job.task_id for job in jobs}) == 1
    assert len((await bb.list()).jobs) == 1


async def test_queue_full(tmp_path: Path, backend_kind: str) -> None:
    bb = Backburner(
        f"sqlite:///{tmp_path}/q.db" if backend_kind == "sqlite" else "memory://",
        settings=Settings(max_queue_size=2),
    )

    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    await bb.enqueue("noop")
    await bb.enqueue("noop")
    with pytest.raises(QueueFullError, match="max_queue_size"):
        await bb.enqueue("noop")
    assert len((await bb.list()).jobs) == 2
    await bb.close()


async def test_corrupt_and_unwritable_databases(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"garbage" * 1000)
    with pytest.raises(BackendError, match="cannot open SQLite database"):
        await Backburner(f"sqlite:///{corrupt}").connect()
    with pytest.raises(BackendError, match="does not exist"):
        await Backburner(f"sqlite:///{tmp_path}/missing/dir/x.db").connect()
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(BackendError):
            await Backburner(f"sqlite:///{locked}/x.db").connect()
    readonly_parent = Path("/proc/backburner.db")
    with pytest.raises(BackendError, match="cannot open SQLite database"):
        await Backburner(f"sqlite:///{readonly_parent}").connect()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("bogus://", "unknown backend URL"),
        ("sqlite://", "give a file path"),
        ("sqlite:///:memory:", "give a file path"),
        ("sqlite://host/x.db", "invalid SQLite URL"),
        ("sqlite:/x.db", "invalid SQLite URL"),  # (it opened the relative x.db)
        ("sqlite:///a#b.db", "%23"),  # (it opened a file named a)
        ("sqlite:///x.db?wat=1", "unknown SQLite URL option"),
        ("sqlite:///x.db?synchronous=SOMETIMES", "synchronous"),
        ("sqlite:///x.db?poll_interval_ms=-1", "poll_interval_ms"),
        ("sqlite:///x.db?poll_interval_ms=nan", "poll_interval_ms"),
        ("sqlite:///x.db?poll_interval_ms=0", "poll_interval_ms"),
        ("postgresql://localhost/db", "not available yet"),
        ("redis://localhost/zero", "database number"),
        ("redis://localhost/0?prefix=a{b}", "prefix"),
        ("redis://localhost/0?prefix=", "prefix"),
    ],
)
def test_bad_backend_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Backburner(url)


def test_a_sqlite_url_path_is_percent_decoded() -> None:
    # sqlite:///my%20db.db opened a file named my%20db.db.
    engine = Backburner("sqlite:///my%20db%23.db").backend
    assert engine.path == "my db#.db"  # type: ignore[attr-defined]


def test_a_redis_url_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # as if redis-py were not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'backburner\[redis\]'"):
        Backburner("redis://localhost:6379/0")


def test_settings_check_their_types() -> None:
    with pytest.raises(ConfigurationError, match="concurrency must be int"):
        Settings(concurrency="5")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease_s must be float"):
        Settings(lease_s=math.nan)
    with pytest.raises(ConfigurationError, match="lease_s must be float"):
        Settings(lease_s=10**400)  # (an int no float holds: not an OverflowError)
    with pytest.raises(ConfigurationError, match="max_json_depth must be at most 192"):
        Settings(max_json_depth=500)  # (the API would take input no reader could read back)


@pytest.mark.parametrize(
    "name",
    ["lease_s", "webhook_timeout_s", "default_ttl_s", "default_timeout_s", "shutdown_grace_s"],
)
def test_an_infinite_setting_fails_at_start(name: str) -> None:
    # Accepted, an infinite lease was written into the jobs a worker claimed, as text no
    # reader takes: the job could never be read or swept again.
    with pytest.raises(ConfigurationError, match=rf"^{name} must be float.* \(finite\), got inf$"):
        Settings.from_env({f"BACKBURNER_{name.upper()}": "inf"})
    with pytest.raises(ConfigurationError, match=rf"^{name} must be float"):
        Settings(**{name: -math.inf})
    with pytest.raises(ConfigurationError, match="backend_url must be str"):
        Settings(backend_url=None)  # type: ignore[arg-type]


def test_settings_from_env_fail_loudly() -> None:
    settings = Settings.from_env({"BACKBURNER_CONCURRENCY": "50", "BACKBURNER_LEASE_S": "12.5"})
    assert settings.concurrency == 50 and settings.lease_s == 12.5
    assert Settings.from_env({"BACKBURNER_MAX_QUEUE_SIZE": "none"}).max_queue_size is None
    with pytest.raises(ConfigurationError, match="BACKBURNER_CONCURRENCY='many' is not an"):
        Settings.from_env({"BACKBURNER_CONCURRENCY": "many"})
    with pytest.raises(ConfigurationError, match="concurrency must be > 0"):
        Settings.from_env({"BACKBURNER_CONCURRENCY": "0"})
    with pytest.raises(ConfigurationError, match="heartbeat_s"):
        Settings(lease_s=5, heartbeat_s=5)


def test_task_registration_errors() -> None:
    bb = Backburner("memory://")

    with pytest.raises(ConfigurationError, match="async function"):

        @bb.task
        def not_async(ctx: JobContext) -> None:  # type: ignore[type-var]
            return None

    @bb.task
    async def once(ctx: JobContext) -> None:
        return None

    with pytest.raises(ConfigurationError, match="already registered"):
        bb.task(name="once")(once)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        bb.task(max_attempts=0)(once)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        bb.task(name="b", max_attempts=True)(once)
    with pytest.raises(ConfigurationError, match="timeout"):
        bb.task(name="n", timeout=math.nan)(once)
    with pytest.raises(ConfigurationError, match="priority"):
        bb.task(name="p", priority=1000)(once)


async def test_replay_and_events_validate_arguments(backend: Backend) -> None:
    bb = make_app(backend)
    job = await bb.enqueue("summarize", {"text": "a"})
    with pytest.raises(InvalidInputError, match="max_attempts"):
        await bb.replay(job.task_id, max_attempts=0)
    with pytest.raises(InvalidInputError, match="limit"):
        await bb.events(job.task_id, limit=-1)
    with pytest.raises(InvalidInputError, match="after"):
        await bb.events(job.task_id, after=-1)
    for past in (2**63, 2**63 - 1, 10**18):  # (OverflowError on SQLite, a BackendError on Redis)
        with pytest.raises(InvalidInputError, match="after"):
            await bb.events(job.task_id, after=past)
    assert await bb.events(job.task_id, after=10**18 - 1) == []
    with pytest.raises(JobNotFoundError):
        await bb.events("task_nope")
    assert [e.seq for e in await bb.events(job.task_id)] == [1]


def test_retry_after_must_be_finite() -> None:
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number >= 0"):
            Retry(after=bad)
    assert Retry(after=0).after == 0


async def test_list_validates_arguments(backend: Backend) -> None:
    bb = make_app(backend)
    with pytest.raises(InvalidInputError, match="unknown status"):
        await bb.list(status="sleeping")
    with pytest.raises(InvalidInputError, match="limit"):
        await bb.list(limit=0)
    job = await bb.enqueue("summarize", {"text": "a"})
    assert (await bb.list(status=JobStatus.QUEUED)).jobs[0].task_id == job.task_id


async def test_a_tasks_validate_refuses_bad_values_at_submission() -> None:
    bb = Backburner("memory://")

    def positive(payload: dict[str, Any]) -> None:
        if not isinstance(payload.get("n"), int) or payload["n"] <= 0:
            raise InvalidInputError("n must be a positive integer")

    @bb.task(validate=positive)
    async def count(ctx: JobContext, n: Any) -> int:
        return int(n)

    async with bb:
        with pytest.raises(InvalidInputError, match="positive"):
            await bb.enqueue("count", {"n": -1})
        with pytest.raises(InvalidInputError, match="does not fit"):  # binding comes first
            await bb.enqueue("count", {"m": 1})
        assert (await bb.list(limit=5)).jobs == []
        assert (await bb.enqueue("count", {"n": 2})).input == {"n": 2}
