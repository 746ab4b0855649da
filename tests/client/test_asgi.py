"""AsyncClient against the real app in-process (httpx.ASGITransport, lifespan running)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from backburner.client import APIError, AsyncClient, JobStatus, RetryPolicy, Task
from backburner.errors import (
    IdempotencyConflictError,
    InvalidInputError,
    InvalidTransitionError,
    JobNotFoundError,
    QueueFullError,
    UnknownTaskError,
    WaitTimeoutError,
)

from .support import FakeClock, SlowEmptyReads, make_app


async def finished(client: AsyncClient, task_id: str) -> Task:
    """The job once its stream has ended (no polling delays)."""
    async for _ in client.stream(task_id):
        pass
    return await client.get(task_id)


async def test_generate_stream_and_wait(aclient: AsyncClient) -> None:
    job = await aclient.generate("hello there", max_tokens=5, metadata={"user": "u1"})
    assert job.created and job.status == "queued"
    assert job.poll_url == f"/v1/tasks/{job.task_id}"
    assert job.stream_url == f"/v1/tasks/{job.task_id}/events"
    events = [event async for event in aclient.stream(job.task_id)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.data["text"] for e in events if e.type == "token"]
    assert events[-1].type == "status" and events[-1].data["status"] == "completed"
    done = await aclient.wait(job.task_id, timeout=10)
    assert isinstance(done, Task) and done.is_terminal
    assert done.status == JobStatus.COMPLETED and done.metadata == {"user": "u1"}
    assert done.usage is not None and done.usage.output_tokens == 5
    later = [e.seq async for e in aclient.stream(job.task_id, after=2)]
    assert later == [e.seq for e in events[2:]]


async def test_messages_and_options(aclient: AsyncClient) -> None:
    job = await aclient.generate(
        messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0.5
    )
    task = await finished(aclient, job.task_id)
    assert task.status == JobStatus.COMPLETED
    assert task.input["messages"] == [{"role": "user", "content": "hi"}]
    assert task.input["temperature"] == 0.5


async def test_submit_get_list_cancel_delete(aclient: AsyncClient) -> None:
    later = await aclient.submit(
        "echo", {"text": "x"}, priority=7, delay_s=60, max_attempts=2, ttl_s=600, timeout_s=9
    )
    task = await aclient.get(later.task_id)
    assert (task.type, task.priority, task.max_attempts) == ("echo", 7, 2)
    now = await aclient.submit("echo", {"text": "now"})
    assert (await finished(aclient, now.task_id)).result == {"text": "now"}

    queued = await aclient.list(status="queued", type="echo")
    assert [t.task_id for t in queued.data] == [later.task_id]
    first = await aclient.list(limit=1)
    assert len(first.data) == 1 and first.next_cursor is not None
    everything = [t.task_id async for t in aclient.iter_tasks(page_size=1)]
    assert sorted(everything) == sorted([later.task_id, now.task_id])

    with pytest.raises(InvalidTransitionError) as raised:
        await aclient.delete(later.task_id)  # still queued
    assert (raised.value.status, raised.value.type) == (409, "invalid_state")
    cancelled = await aclient.cancel(later.task_id)
    assert cancelled.status == JobStatus.CANCELLED
    assert (await aclient.cancel(later.task_id)).status == JobStatus.CANCELLED  # idempotent
    await aclient.delete(later.task_id)
    with pytest.raises(JobNotFoundError) as missing:
        await aclient.get(later.task_id)
    assert missing.value.task_id == later.task_id
    assert str(missing.value) == f"no job with id {later.task_id!r}"  # the server's message


async def test_dead_letters_replay_and_stats(aclient: AsyncClient) -> None:
    job = await aclient.submit("boom", {"reason": "no good"})
    failed = await finished(aclient, job.task_id)
    assert failed.status == JobStatus.FAILED and failed.error is not None
    assert failed.error.message == "no good"
    dlq = await aclient.dead_letters()
    assert [t.task_id for t in dlq.data] == [job.task_id]
    assert dlq.data[0].history[0].outcome is not None
    stats = await aclient.stats()
    assert stats.dead_letter == 1 and stats.counts[JobStatus.FAILED] == 1
    replayed = await aclient.replay(job.task_id)
    assert replayed.task_id == job.task_id and replayed.status in ("queued", "processing")
    again = await finished(aclient, job.task_id)
    assert again.status == JobStatus.FAILED and len(again.history) == 2
    # The log now holds two terminal events; the stream runs to the latest, like the server.
    events = [e async for e in aclient.stream(job.task_id)]
    statuses = [e.data["status"] for e in events if e.type == "status"]
    assert statuses == ["queued", "processing", "failed", "queued", "processing", "failed"]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    with pytest.raises(InvalidTransitionError):
        await aclient.replay((await aclient.submit("echo", {"text": "ok"}, delay_s=60)).task_id)


async def test_idempotent_submit(aclient: AsyncClient) -> None:
    first = await aclient.submit("echo", {"text": "a"}, idempotency_key="req-42")
    again = await aclient.submit("echo", {"text": "a"}, idempotency_key="req-42")
    assert first.created and not again.created
    assert again.task_id == first.task_id
    with pytest.raises(IdempotencyConflictError) as raised:
        await aclient.submit("echo", {"text": "b"}, idempotency_key="req-42")
    err = raised.value
    assert isinstance(err, APIError) and (err.status, err.type) == (409, "idempotency_conflict")
    assert (err.key, err.task_id) == ("req-42", first.task_id)
    other = await aclient.submit("echo", {"text": "a"})  # no key: a fresh one each call
    assert other.created and other.task_id != first.task_id


@pytest.mark.parametrize(
    ("call", "cls", "type_"),
    [
        ({"type": "nope"}, UnknownTaskError, "unknown_task"),
        ({"type": "echo", "priority": 1000}, InvalidInputError, "invalid_request"),
        ({"type": "echo", "input": {"wrong": 1}}, InvalidInputError, "invalid_input"),
    ],
)
async def test_invalid_submissions(
    aclient: AsyncClient, call: dict[str, Any], cls: type[Exception], type_: str
) -> None:
    with pytest.raises(cls) as raised:
        await aclient.submit(**call)
    assert isinstance(raised.value, APIError)
    assert (raised.value.status, raised.value.type) == (422, type_)
    assert raised.value.message == str(raised.value) and raised.value.message


async def test_body_too_large_and_limits() -> None:
    application = make_app(max_body_bytes=2000, max_tokens_limit=100)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with AsyncClient("http://testserver", transport=transport) as client:
            with pytest.raises(InvalidInputError) as big:
                await client.submit("echo", {"text": "x" * 5000})
            assert (big.value.status, big.value.type) == (413, "body_too_large")
            with pytest.raises(InvalidInputError, match="limited to 100"):
                await client.generate("hi", max_tokens=101)
            with pytest.raises(InvalidInputError, match="exactly one of prompt or messages"):
                await client.generate()


async def test_queue_full_is_retried_as_the_server_asks_then_raised() -> None:
    application = make_app(max_queue_size=1, run_worker=False)
    clock = FakeClock()
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with AsyncClient(
            "http://testserver", transport=transport, sleep=clock.asleep, clock=clock
        ) as client:
            await client.submit("echo", {"text": "1"})
            with pytest.raises(QueueFullError) as raised:
                await client.submit("echo", {"text": "2"})
            assert clock.sleeps == [5.0, 5.0, 5.0]  # 3 retries, each after Retry-After: 5
            assert raised.value.retry_after == 5.0 and raised.value.status == 429
            assert (await client.stats()).counts[JobStatus.QUEUED] == 1
            none = AsyncClient("http://testserver", transport=transport, retry=RetryPolicy(0))
            async with none:
                with pytest.raises(QueueFullError):
                    await none.submit("echo", {"text": "3"})


async def test_stream_of_a_missing_job(aclient: AsyncClient) -> None:
    with pytest.raises(JobNotFoundError):
        async for _ in aclient.stream("task_missing"):
            pass


async def test_wait_timeout_on_the_real_app(aclient: AsyncClient) -> None:
    job = await aclient.submit("echo", {"text": "later"}, delay_s=60)
    with pytest.raises(WaitTimeoutError) as raised:
        await aclient.wait(job.task_id, timeout=0.2)
    assert isinstance(raised.value, TimeoutError)
    assert (raised.value.task_id, raised.value.status) == (job.task_id, "queued")


class Counting(httpx.ASGITransport):
    def __init__(self, app: Any) -> None:
        super().__init__(app=app)
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await super().handle_async_request(request)


async def test_a_terminal_event_landing_between_two_reads_is_still_sent() -> None:
    """The server reads new events, finds none, then sees the job finished: the terminal
    event landed in between. It must look once more and send it rather than close."""
    application = make_app(SlowEmptyReads())
    async with application.router.lifespan_context(application):
        transport = Counting(application)
        clock = FakeClock()
        async with AsyncClient(
            "http://testserver", transport=transport, sleep=clock.asleep
        ) as client:

            async def running() -> str:
                job = await client.submit("slowpoke")
                while (await client.get(job.task_id)).status != JobStatus.PROCESSING:
                    await asyncio.sleep(0.01)
                return job.task_id

            shown = await running()
            raw = await client._http.get(
                f"/v1/tasks/{shown}/events", headers={"Last-Event-ID": "2"}
            )
            assert "id: 3\nevent: status\n" in raw.text
            assert '"status":"completed"' in raw.text

            task_id = await running()
            transport.paths.clear()
            events = [e async for e in client.stream(task_id, after=2)]
    assert [(e.seq, e.type, e.data["status"]) for e in events] == [(3, "status", "completed")]
    streams = [p for p in transport.paths if p.endswith("/events")]
    assert len(streams) == 1  # no reconnect needed
    assert clock.sleeps == []
