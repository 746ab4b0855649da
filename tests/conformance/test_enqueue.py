"""enqueue: stored fields, first event, idempotency keys, JSON-only input, queue-size bound."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete
from backburner.errors import (
    BackburnerError,
    IdempotencyConflictError,
    InvalidInputError,
    QueueFullError,
)
from backburner.models import JobStatus, Progress

from ._support import LEASE, T0, claim_one, enqueue, new_job, opened, snapshot


async def test_enqueue_stores_every_field(backend: Backend) -> None:
    new = new_job(
        "summarize",
        {"text": "hi", "n": [1, 2], "nested": {"k": None}},
        now=T0,
        run_at=T0 + 5,
        priority=7,
        max_attempts=4,
        ttl_s=120.0,
        idempotency_key="key-1",
        timeout_s=60.0,
        deadline_at=T0 + 600,
        metadata={"tenant": "acme", "tags": ["a", "b"]},
        webhook_url="https://example.com/hook",
    )
    job, created = await backend.enqueue(new)
    assert created is True
    stored = await backend.get(new.task_id)
    assert stored is not None
    for j in (job, stored):
        assert j.task_id == new.task_id
        assert j.type == "summarize"
        assert j.status == JobStatus.QUEUED
        assert j.input == {"text": "hi", "n": [1, 2], "nested": {"k": None}}
        assert j.created_at == T0
        assert j.run_at == T0 + 5
        assert j.priority == 7
        assert j.max_attempts == 4
        assert j.ttl_s == 120.0
        assert j.idempotency_key == "key-1"
        assert j.timeout_s == 60.0
        assert j.deadline_at == T0 + 600
        assert j.metadata == {"tenant": "acme", "tags": ["a", "b"]}
        assert j.webhook_url == "https://example.com/hook"
        # Nothing has happened to it yet.
        assert (j.attempts, j.fence, j.history) == (0, 0, [])
        assert j.worker_id is None and j.lease_expires_at is None
        assert j.started_at is None and j.finished_at is None and j.expires_at is None
        assert j.result is None and j.error is None and j.usage is None
        assert j.progress == Progress(percent=0.0, message=None)
    assert stored.model_dump() == job.model_dump()


async def test_enqueue_defaults_are_stored(backend: Backend) -> None:
    job = await enqueue(backend)
    stored = await backend.get(job.task_id)
    assert stored is not None
    assert stored.idempotency_key is None
    assert stored.timeout_s is None and stored.deadline_at is None
    assert stored.metadata == {} and stored.webhook_url is None


async def test_enqueue_writes_the_first_event(backend: Backend) -> None:
    job = await enqueue(backend, now=T0 + 3)
    events = await backend.events(job.task_id)
    assert len(events) == 1
    (first,) = events
    assert first.task_id == job.task_id
    assert first.seq == 1
    assert first.type == "status"
    assert first.data == {"status": "queued"}
    assert first.at == T0 + 3


async def test_input_is_stored_as_json(backend: Backend) -> None:
    """What goes in is what a JSON round trip gives back (tuples become lists)."""
    job = await enqueue(backend, payload={"pair": (1, 2), "f": 1.5, "s": "é"})
    stored = await backend.get(job.task_id)
    assert stored is not None
    assert stored.input == {"pair": [1, 2], "f": 1.5, "s": "é"}
    assert job.input == stored.input


@pytest.mark.parametrize(
    "field, value",
    [
        ("input", {"x": object()}),
        ("input", {"x": float("nan")}),
        ("input", {"x": {1, 2}}),
        ("metadata", {"x": object()}),
        ("metadata", {"x": float("inf")}),
    ],
    ids=["input-object", "input-nan", "input-set", "metadata-object", "metadata-inf"],
)
async def test_non_json_input_is_refused_and_nothing_stored(
    backend: Backend, field: str, value: dict[str, object]
) -> None:
    if field == "input":
        new = new_job("summarize", value, fp="fingerprint-of-unserialisable")
    else:
        new = new_job(metadata=value)
    with pytest.raises(InvalidInputError):
        await backend.enqueue(new)
    assert await backend.get(new.task_id) is None
    assert await backend.events(new.task_id) == []
    assert (await backend.list_jobs()).jobs == []
    assert (await backend.stats(now=T0)).counts[JobStatus.QUEUED] == 0


async def test_same_key_same_fingerprint_returns_the_existing_job(backend: Backend) -> None:
    first = new_job(payload={"q": 1}, idempotency_key="order-7", priority=1)
    job, created = await backend.enqueue(first)
    assert created is True
    before = await snapshot(backend, job.task_id)

    # Same key, same input: a retried request. Other fields (and the task id) may differ.
    again = new_job(payload={"q": 1}, idempotency_key="order-7", priority=9, now=T0 + 50)
    assert again.task_id != first.task_id
    existing, created_again = await backend.enqueue(again)
    assert created_again is False
    assert existing.task_id == first.task_id
    assert existing.priority == 1 and existing.created_at == T0
    assert await backend.get(again.task_id) is None
    assert await backend.events(again.task_id) == []
    assert await snapshot(backend, job.task_id) == before
    assert [j.task_id for j in (await backend.list_jobs()).jobs] == [first.task_id]


async def test_same_key_returns_the_job_in_its_current_state(backend: Backend) -> None:
    job = await enqueue(backend, payload={"q": 1}, idempotency_key="k")
    claimed = await claim_one(backend, job.task_id, now=T0 + 1)
    await backend.finish(job.task_id, claimed.fence, Complete(result="done"), now=T0 + 2)
    existing, created = await backend.enqueue(new_job(payload={"q": 1}, idempotency_key="k"))
    assert created is False
    assert existing.task_id == job.task_id
    assert existing.status == JobStatus.COMPLETED
    assert existing.result == "done"


async def test_same_key_different_fingerprint_conflicts(backend: Backend) -> None:
    job = await enqueue(backend, payload={"q": 1}, idempotency_key="order-7")
    before = await snapshot(backend, job.task_id)
    other = new_job(payload={"q": 2}, idempotency_key="order-7")
    with pytest.raises(IdempotencyConflictError) as raised:
        await backend.enqueue(other)
    assert raised.value.key == "order-7"
    assert raised.value.task_id == job.task_id
    assert await backend.get(other.task_id) is None
    assert await snapshot(backend, job.task_id) == before
    assert len((await backend.list_jobs()).jobs) == 1


@pytest.mark.parametrize("first, second", [("acme", "default"), ("default", "acme")])
async def test_a_key_held_by_another_tenants_job_conflicts_naming_no_job(
    backend: Backend, first: str, second: str
) -> None:
    # The same body, so only the tenant tells the two apart: the repeat must not be answered
    # with the other tenant's job (its input, its result), nor name it.
    held = await enqueue(backend, payload={"q": 1}, idempotency_key="acme/k", tenant=first)
    before = await snapshot(backend, held.task_id)
    other = new_job(payload={"q": 1}, idempotency_key="acme/k", tenant=second)
    with pytest.raises(IdempotencyConflictError) as raised:
        await backend.enqueue(other)
    assert raised.value.key == "acme/k"
    assert raised.value.task_id == ""
    assert held.task_id not in str(raised.value)
    assert await backend.get(other.task_id) is None
    assert await snapshot(backend, held.task_id) == before
    assert len((await backend.list_jobs()).jobs) == 1
    again, created = await backend.enqueue(
        new_job(payload={"q": 1}, idempotency_key="acme/k", tenant=first)
    )
    assert (again.task_id, created) == (held.task_id, False)


async def test_different_keys_and_no_key_create_separate_jobs(backend: Backend) -> None:
    a = await enqueue(backend, payload={"q": 1}, idempotency_key="a")
    b = await enqueue(backend, payload={"q": 1}, idempotency_key="b")
    c = await enqueue(backend, payload={"q": 1})
    d = await enqueue(backend, payload={"q": 1})
    assert len({a.task_id, b.task_id, c.task_id, d.task_id}) == 4
    assert (await backend.stats(now=T0)).counts[JobStatus.QUEUED] == 4


async def test_an_existing_task_id_is_never_overwritten(backend: Backend) -> None:
    job = await enqueue(backend, payload={"q": 1})
    before = await snapshot(backend, job.task_id)
    clash = replace(new_job(payload={"q": 2}), task_id=job.task_id)
    try:
        await backend.enqueue(clash)
    except BackburnerError:
        pass
    assert await snapshot(backend, job.task_id) == before


# -- the queue-size bound -----------------------------------------------------------------------


async def test_queue_full_is_raised_at_the_bound(backend_kind: str, tmp_path: Path) -> None:
    async with opened(backend_kind, tmp_path / "bounded", max_queue_size=2) as bounded:
        await enqueue(bounded)
        await enqueue(bounded)
        refused = new_job()
        with pytest.raises(QueueFullError):
            await bounded.enqueue(refused)
        assert await bounded.get(refused.task_id) is None
        assert await bounded.events(refused.task_id) == []
        assert (await bounded.stats(now=T0)).counts[JobStatus.QUEUED] == 2


async def test_claiming_cancelling_and_completing_free_room(
    backend_kind: str, tmp_path: Path
) -> None:
    async with opened(backend_kind, tmp_path / "bounded", max_queue_size=2) as bounded:
        a = await enqueue(bounded, now=T0)
        b = await enqueue(bounded, now=T0 + 1)
        with pytest.raises(QueueFullError):
            await bounded.enqueue(new_job())

        # Claiming frees room: the bound counts queued jobs.
        claimed = await claim_one(bounded, a.task_id, now=T0 + 2)
        c = await enqueue(bounded, now=T0 + 3)
        with pytest.raises(QueueFullError):
            await bounded.enqueue(new_job())

        # Cancelling a queued job frees room.
        await bounded.cancel(b.task_id, now=T0 + 4)
        d = await enqueue(bounded, now=T0 + 5)
        with pytest.raises(QueueFullError):
            await bounded.enqueue(new_job())

        # Once everything is claimed and completed, the whole bound is available again.
        await bounded.finish(a.task_id, claimed.fence, Complete(result=1), now=T0 + 6)
        for job in await bounded.claim("w1", limit=10, now=T0 + 7, lease_s=30):
            await bounded.finish(job.task_id, job.fence, Complete(result=1), now=T0 + 8)
        for task_id in (c.task_id, d.task_id):
            got = await bounded.get(task_id)
            assert got is not None and got.status == JobStatus.COMPLETED
        await enqueue(bounded, now=T0 + 9)
        await enqueue(bounded, now=T0 + 9)
        with pytest.raises(QueueFullError):
            await bounded.enqueue(new_job())
        counts = (await bounded.stats(now=T0)).counts
        assert counts[JobStatus.QUEUED] == 2
        assert counts[JobStatus.COMPLETED] == 3


async def test_idempotent_repeat_succeeds_when_the_queue_is_full(
    backend_kind: str, tmp_path: Path
) -> None:
    async with opened(backend_kind, tmp_path / "bounded", max_queue_size=1) as bounded:
        job = await enqueue(bounded, payload={"q": 1}, idempotency_key="k")
        existing, created = await bounded.enqueue(new_job(payload={"q": 1}, idempotency_key="k"))
        assert created is False
        assert existing.task_id == job.task_id
        with pytest.raises(IdempotencyConflictError):
            await bounded.enqueue(new_job(payload={"q": 2}, idempotency_key="k"))


async def test_without_a_bound_the_queue_takes_many_jobs(backend: Backend) -> None:
    for i in range(50):
        await enqueue(backend, payload={"i": i})
    assert (await backend.stats(now=T0)).counts[JobStatus.QUEUED] == 50


async def test_the_trace_context_is_kept_with_the_job(backend: Backend) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    job = await enqueue(backend, traceparent=parent)
    assert job.traceparent == parent
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.traceparent == parent
    (claimed,) = await backend.claim("w1", limit=1, now=T0, lease_s=LEASE)
    assert claimed.traceparent == parent
    plain = await enqueue(backend)
    assert (await backend.get(plain.task_id)).traceparent is None  # type: ignore[union-attr]
