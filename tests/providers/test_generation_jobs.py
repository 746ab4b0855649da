"""The built-in ``generate`` task end to end: a worker, a backend, and the fake OpenAI server."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, Job, JobContext, JobStatus
from backburner.builtin import install_builtin_tasks
from backburner.providers import ModelRouter

from ..helpers import WORKER_TEST_SETTINGS, eventually, running_worker
from .fake_openai import FakeOpenAI

pytestmark = pytest.mark.timeout(60)


def tag(kind: str) -> str:
    """An upstream model name of ``kind`` that no other test shares (its own fail counter)."""
    return f"{kind}.{uuid.uuid4().hex[:8]}"


def route(fake: FakeOpenAI, upstream: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "openai", "base_url": fake.base_url, "upstream": upstream, **extra}


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Any]:
    apps: list[Backburner] = []

    async def build(models: dict[str, Any]) -> Backburner:
        settings = WORKER_TEST_SETTINGS.replace(backend_url=f"sqlite:///{tmp_path / 'jobs.db'}")
        bb = Backburner(settings=settings, models=ModelRouter({"models": models}))
        install_builtin_tasks(bb)
        await bb.connect()
        apps.append(bb)
        return bb

    yield build
    for bb in apps:
        await bb.close()


async def run_one(bb: Backburner, **payload: Any) -> Job:
    async with running_worker(bb, concurrency=4):
        job = await bb.enqueue("generate", {"prompt": "Hello", "max_tokens": 5, **payload})
        return await bb.wait(job.task_id, timeout=30)


async def test_a_generation_streams_tokens_and_records_usage_and_cost(
    fake: FakeOpenAI, make: Any
) -> None:
    prices = {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 10.0}
    bb = await make({"gpt": route(fake, tag("ok"), **prices)})
    job = await run_one(bb, model="gpt")
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {
        "text": "alpha beta gamma delta epsilon",
        "model": "gpt",
        "provider": "openai",
        "finish_reason": "length",
        "simulated": False,
    }
    usage = job.usage.model_dump() if job.usage else {}
    assert (usage["input_tokens"], usage["output_tokens"]) == (7, 5)
    assert usage["cost_usd"] == pytest.approx((7 * 2.0 + 5 * 10.0) / 1e6)
    assert usage["time_to_first_token_s"] > 0 and usage["tokens_per_s"] > 0
    assert usage["model"] == "gpt" and usage["calls"] == 1
    tokens = [e.data for e in await bb.events(job.task_id) if e.type == "token"]
    assert "".join(t["text"] for t in tokens) == job.result["text"]
    assert all(t["attempt"] == 1 and t["model"] == "gpt" for t in tokens)


async def test_429_retry_after_is_waited_for_before_the_retry(fake: FakeOpenAI, make: Any) -> None:
    upstream = tag("ratelimit-1")  # 429 with Retry-After: 1, then a normal stream
    bb = await make({"gpt": route(fake, upstream)})
    job = await run_one(bb, model="gpt")
    assert job.status is JobStatus.COMPLETED and job.attempts == 2
    first, second = fake.state.calls_of(upstream)
    waited = second.started - first.started
    # The retry backoff of these settings is at most 0.05 s: only Retry-After explains >= 1 s.
    assert 1.0 <= waited < 3.0, waited
    failed = [e.data for e in await bb.events(job.task_id) if e.type == "attempt_failed"]
    assert failed[0]["error"]["type"] == "rate_limited"


async def test_a_500_is_retried_and_then_succeeds(fake: FakeOpenAI, make: Any) -> None:
    bb = await make({"gpt": route(fake, tag("fail500-1"))})
    job = await run_one(bb, model="gpt")
    assert job.status is JobStatus.COMPLETED and job.attempts == 2
    failed = [e.data for e in await bb.events(job.task_id) if e.type == "attempt_failed"]
    assert [f["error"]["type"] for f in failed] == ["provider_unavailable"]


async def test_a_context_length_error_fails_at_once(fake: FakeOpenAI, make: Any) -> None:
    upstream = tag("context")
    bb = await make({"gpt": route(fake, upstream)})
    job = await run_one(bb, model="gpt")
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert job.error is not None
    assert (job.error.type, job.error.retryable) == ("context_length_exceeded", False)
    assert "maximum context length" in job.error.message
    assert len(fake.state.calls_of(upstream)) == 1


async def test_a_stream_cut_mid_way_keeps_its_tokens_and_the_retry_completes(
    fake: FakeOpenAI, make: Any
) -> None:
    bb = await make({"gpt": route(fake, tag("cut-1"))})
    job = await run_one(bb, model="gpt", max_tokens=6)
    assert job.status is JobStatus.COMPLETED and job.attempts == 2
    events = await bb.events(job.task_id)
    first = [e.data for e in events if e.type == "token" and e.data["attempt"] == 1]
    # The partial text of the cut attempt (its deltas may share events when they came at once).
    assert "".join(t["text"] for t in first) == "alpha beta gamma"
    assert sum(t["tokens"] for t in first) == 3
    failed = [e.data for e in events if e.type == "attempt_failed"]
    assert failed[0]["error"]["type"] == "stream_interrupted"
    assert job.result is not None and job.result["text"].startswith("alpha beta gamma delta")


async def test_cancelling_a_slow_generation_closes_the_upstream_stream_within_a_second(
    fake: FakeOpenAI, make: Any
) -> None:
    upstream = tag("slow")
    bb = await make({"gpt": route(fake, upstream)})
    async with running_worker(bb, concurrency=4):
        job = await bb.enqueue("generate", {"prompt": "Hi", "model": "gpt", "max_tokens": 200})

        async def tokens() -> list[str]:
            return [e.data["text"] for e in await bb.events(job.task_id) if e.type == "token"]

        await eventually(lambda: _at_least(tokens, 3), message="three token events")
        cancelled_at = time.monotonic()
        await bb.cancel(job.task_id)
        (call,) = fake.state.calls_of(upstream)
        await eventually(lambda: call.ended is not None, timeout=5, message="upstream closed")
        assert call.ended is not None and call.ended - cancelled_at < 1.0
        assert call.chunks_sent < 200
        kept = await tokens()
        assert len(kept) >= 3 and "".join(kept).startswith("alpha beta gamma")
        assert (await bb.get(job.task_id)).status is JobStatus.CANCELLED


async def _at_least(read: Any, n: int) -> bool:
    return len(await read()) >= n


async def test_after_a_retryable_failure_the_next_attempt_goes_to_the_fallback_model(
    fake: FakeOpenAI, make: Any
) -> None:
    broken, backup = tag("fail500"), tag("ok")
    bb = await make(
        {"primary": route(fake, broken, fallback=["backup"]), "backup": route(fake, backup)}
    )
    started = time.monotonic()
    job = await run_one(bb, model="primary")
    assert job.status is JobStatus.COMPLETED and job.attempts == 2
    assert job.result is not None and job.result["model"] == "backup"
    assert (len(fake.state.calls_of(broken)), len(fake.state.calls_of(backup))) == (1, 1)
    failed = [e.data for e in await bb.events(job.task_id) if e.type == "attempt_failed"]
    assert "next attempt goes to model 'backup'" in failed[0]["error"]["message"]
    assert time.monotonic() - started < 10


async def test_a_spent_quota_fails_at_once_without_a_fallback_and_moves_with_one(
    fake: FakeOpenAI, make: Any
) -> None:
    spent, backup = tag("quota"), tag("ok")
    models = {
        "alone": route(fake, spent),
        "paid": route(fake, spent, fallback=["spare"]),
        "spare": route(fake, backup),
    }
    bb = await make(models)
    alone = await run_one(bb, model="alone")
    assert alone.status is JobStatus.FAILED and alone.attempts == 1
    assert alone.error is not None and alone.error.type == "quota_exhausted"
    assert not alone.error.retryable and "exceeded your current quota" in alone.error.message
    moved = await run_one(bb, model="paid")
    assert moved.status is JobStatus.COMPLETED and moved.attempts == 2
    assert moved.result is not None and moved.result["model"] == "spare"
    failed = [e.data for e in await bb.events(moved.task_id) if e.type == "attempt_failed"]
    assert failed[0]["error"]["type"] == "rate_limited"
    assert "next attempt goes to model 'spare'" in failed[0]["error"]["message"]


async def test_an_unknown_model_fails_the_job_at_once(make: Any) -> None:
    bb = await make({})
    job = await run_one(bb, model="gpt-9")
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert job.error is not None and job.error.type == "model_not_found"


async def test_the_simulator_is_named_as_such(make: Any) -> None:
    bb = await make({})
    job = await run_one(bb)
    assert job.status is JobStatus.COMPLETED
    assert job.result is not None and job.result["simulated"] is True
    assert job.result["provider"] == "simulated" and len(job.result["text"].split()) == 5
    assert asyncio.get_running_loop() is not None


async def test_when_the_fallback_list_wraps_round_the_wait_is_not_forced_to_zero(
    fake: FakeOpenAI, make: Any
) -> None:
    limited, broken = tag("ratelimit"), tag("fail500")
    bb = await make({"a": route(fake, limited, fallback=["b"]), "b": route(fake, broken)})
    async with running_worker(bb, concurrency=2):
        job = await bb.enqueue(
            "generate", {"prompt": "Hi", "model": "a", "max_tokens": 3}, max_attempts=3
        )
        done = await bb.wait(job.task_id, timeout=30)
    assert done.status is JobStatus.FAILED and done.attempts == 3
    failed = [e.data["error"] for e in await bb.events(job.task_id) if e.type == "attempt_failed"]
    assert [f["type"] for f in failed] == ["rate_limited", "provider_unavailable", "rate_limited"]
    assert "next attempt goes to model 'b'" in failed[0]["message"]
    # b's failure sends the job back to a: that is no fallback, so no note and no forced wait.
    assert "next attempt" not in failed[1]["message"]
    assert "next attempt" not in failed[2]["message"]
    a_calls = fake.state.calls_of(limited)
    assert len(a_calls) == 2


async def test_bad_generation_arguments_fail_at_once(make: Any) -> None:
    bb = await make({})
    job = await run_one(bb, messages=[{"role": "bogus", "content": "x"}])
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert job.error is not None and job.error.type == "invalid_request"


async def test_odd_sampling_arguments_fail_at_once_and_one_stop_is_one_sequence(
    fake: FakeOpenAI, make: Any
) -> None:
    name = tag("ok")
    bb = await make({"gpt": route(fake, name)})

    @bb.task(max_attempts=3)
    async def sample(ctx: JobContext, temperature: str | None = None, stop: Any = ()) -> str:
        degrees = None if temperature is None else float(temperature)  # ("nan" too)
        generated = await ctx.llm.generate("Hi", model="gpt", temperature=degrees, stop=stop)
        return generated.text

    async with running_worker(bb, concurrency=4):
        nan = await bb.enqueue("sample", {"temperature": "nan"})
        hot = await bb.enqueue("sample", {"temperature": "2.5"})
        empty = await bb.enqueue("sample", {"stop": [""]})
        one = await bb.enqueue("sample", {"stop": "abc"})
        done = {
            job.task_id: await bb.wait(job.task_id, timeout=30) for job in (nan, hot, empty, one)
        }
    for job in (nan, hot, empty):
        failed = done[job.task_id]
        assert failed.status is JobStatus.FAILED and failed.attempts == 1
        assert failed.error is not None and failed.error.type == "invalid_request"
    assert done[one.task_id].status is JobStatus.COMPLETED
    [call] = fake.state.calls_of(name)
    assert call.body["stop"] == ["abc"]


async def test_a_task_that_stops_reading_a_stream_keeps_its_tokens_and_usage(make: Any) -> None:
    bb = await make({})

    @bb.task(max_attempts=1)
    async def first_five(ctx: Any) -> str:
        parts: list[str] = []
        async with contextlib.aclosing(
            ctx.llm.stream("tell me", model="simulated", max_tokens=50)
        ) as deltas:
            async for delta in deltas:
                parts.append(delta)
                if len(parts) == 5:
                    break
        return "".join(parts)

    async with running_worker(bb, concurrency=2):
        job = await bb.enqueue("first_five", {})
        done = await bb.wait(job.task_id, timeout=30)
    assert done.status is JobStatus.COMPLETED, done.error
    usage = done.usage.model_dump() if done.usage else {}
    assert usage["output_tokens"] == 5 and usage["estimated"] is True
    tokens = [e.data for e in await bb.events(job.task_id) if e.type == "token"]
    assert "".join(t["text"] for t in tokens) == done.result
