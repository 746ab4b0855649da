"""Pipelines on every backend, in one process: steps stored once, children without a worker
slot, the parent's progress, cancel and failure going both ways, rules of step names."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, Job, JobContext
from backburner.errors import InvalidTransitionError, PermanentError, Retry, Suspend
from backburner.models import JobStatus
from backburner.pipelines import StepRetry, cancel_children

from ..conftest import BACKENDS, drop_redis_keys, make_backend
from ..helpers import WORKER_TEST_SETTINGS, eventually, running_worker


@pytest.fixture(params=BACKENDS)
async def bb(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backburner]:
    engine = make_backend(str(request.param), tmp_path)
    app = Backburner(engine, settings=WORKER_TEST_SETTINGS.replace(pipeline_poll_s=0.5))
    try:
        yield app
    finally:
        await app.close()
        await drop_redis_keys(engine)


async def test_a_failed_run_resumes_and_completed_steps_do_not_run_again(bb: Backburner) -> None:
    runs: Counter[str] = Counter()
    broken = {"step3": 1}

    async def plan(question: str) -> dict[str, Any]:
        runs["plan"] += 1
        return {"queries": [question, question.upper()]}

    def search(plan: dict[str, Any]) -> list[str]:  # a plain function works as a step too
        runs["search"] += 1
        return [f"found {q}" for q in plan["queries"]]

    async def summarize(found: list[str]) -> str:
        runs["summarize"] += 1
        if broken["step3"]:
            broken["step3"] -= 1
            raise RuntimeError("the model fell over")
        return "; ".join(found)

    @bb.pipeline(max_attempts=3)
    async def research(ctx: Any, question: str) -> dict[str, Any]:
        p = await ctx.step("plan", plan, question)
        found = await ctx.step("search", search, p)
        notes = await ctx.step("summarize", summarize, found)
        answer = await ctx.step("answer", lambda: f"answer from {notes}")
        return {"answer": answer}

    async with bb, running_worker(bb, concurrency=1):
        job = await bb.enqueue("research", {"question": "why"})
        done = await bb.wait(job.task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result == {"answer": "answer from found why; found WHY"}
    assert done.attempts == 2
    assert runs == Counter(plan=1, search=1, summarize=2)
    steps = [e.data["name"] for e in await bb.events(job.task_id) if e.type == "step"]
    assert steps == ["plan", "search", "summarize", "answer"]


async def test_a_thousand_children_complete_on_one_worker_slot(bb: Backburner) -> None:
    @bb.task
    async def square(ctx: JobContext, n: int) -> int:
        return n * n

    @bb.pipeline
    async def fan_out(ctx: Any, count: int) -> int:
        squares = await ctx.map("squares", square, list(range(count)))
        return int(sum(squares))

    # A child that starts asks for its parent's status alone, never the whole parent (a
    # batch's record holds every request's input: 10,000 reads of it took minutes).
    whole_reads: list[str] = []
    read_whole = bb.backend.get

    async def counted_get(task_id: str) -> Any:
        whole_reads.append(task_id)
        return await read_whole(task_id)

    bb.backend.get = counted_get  # type: ignore[method-assign]
    async with bb, running_worker(bb, concurrency=1):
        job = await bb.enqueue("fan_out", {"count": 1000})
        done = await bb.wait(job.task_id, timeout=120)
        children = await bb.list(parent_id=job.task_id, limit=1000)
    # (bb.wait's polls read it; every child's start did too: 1,000 and more.)
    assert whole_reads.count(job.task_id) < 100, len(whole_reads)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result == sum(n * n for n in range(1000))
    assert len(children.jobs) == 1000 and children.next_cursor is None
    assert {c.status for c in children.jobs} == {JobStatus.COMPLETED}
    assert {c.parent_id for c in children.jobs} == {job.task_id}
    assert done.attempts == 1  # parking for children charges no attempt


async def test_the_parent_reports_its_childrens_progress(bb: Backburner) -> None:
    gate = asyncio.Event()

    @bb.task
    async def slow(ctx: JobContext, n: int) -> int:
        if n >= 2:
            await gate.wait()
        return n

    @bb.pipeline
    async def parent(ctx: Any) -> list[int]:
        return list(await ctx.map("work", slow, [0, 1, 2, 3]))

    async with bb, running_worker(bb, concurrency=10):
        job = await bb.enqueue("parent")

        async def half_done() -> bool:
            # Parked too: its progress is written before its wait is (a run in between).
            seen = await bb.get(job.task_id)
            return seen.progress.percent == 50.0 and seen.status == JobStatus.QUEUED

        await eventually(half_done, message="parent at 50%, parked")
        parked = await bb.get(job.task_id)
        assert (
            parked.status == JobStatus.QUEUED
            and parked.progress.message == "work: 2/4 children done"
        )
        gate.set()
        done = await bb.wait(job.task_id, timeout=30)
    assert done.result == [0, 1, 2, 3]
    kinds = [e.type for e in await bb.events(job.task_id)]
    assert "spawned" in kinds and "children" in kinds and kinds.count("step") == 1


async def test_a_child_that_fails_for_good_fails_the_parent_naming_it(bb: Backburner) -> None:
    @bb.task(max_attempts=1)
    async def flaky(ctx: JobContext, n: int) -> int:
        if n == 2:
            raise PermanentError("bad source")
        return n

    @bb.pipeline
    async def strict(ctx: Any) -> list[int]:
        return list(await ctx.map("fetch", flaky, [0, 1, 2]))

    @bb.pipeline
    async def lenient(ctx: Any) -> list[int | None]:
        return list(await ctx.map("fetch", flaky, [0, 1, 2], partial=True))

    async with bb, running_worker(bb, concurrency=5):
        failed = await bb.wait((await bb.enqueue("strict")).task_id, timeout=30)
        partial = await bb.wait((await bb.enqueue("lenient")).task_id, timeout=30)
    assert failed.status == JobStatus.FAILED and failed.error is not None
    assert failed.error.type == "ChildFailedError" and failed.attempts == 1
    children = (await bb.list(parent_id=failed.task_id)).jobs
    (bad,) = [c for c in children if c.status == JobStatus.FAILED]
    assert bad.task_id in failed.error.message and "fetch[2]" in failed.error.message
    assert "bad source" in failed.error.message
    assert partial.status == JobStatus.COMPLETED and partial.result == [0, 1, None]


async def test_cancelling_the_parent_cancels_queued_and_running_children(
    bb: Backburner,
) -> None:
    started: set[int] = set()

    @bb.task
    async def long(ctx: JobContext, n: int) -> None:
        started.add(n)
        await asyncio.sleep(60)

    @bb.pipeline
    async def parent(ctx: Any) -> None:
        await ctx.map("long", long, list(range(6)))

    async with bb, running_worker(bb, concurrency=3):
        job = await bb.enqueue("parent")
        await eventually(lambda: len(started) >= 2, message="children running")
        await bb.cancel(job.task_id)
        children = (await bb.list(parent_id=job.task_id)).jobs
        assert len(children) == 6
        assert {c.status for c in children} == {JobStatus.CANCELLED}
    assert (await bb.get(job.task_id)).status == JobStatus.CANCELLED


async def test_a_step_name_used_twice_or_out_of_order_is_a_clear_error(bb: Backburner) -> None:
    first_run = {"yes": True}

    @bb.pipeline
    async def twice(ctx: Any) -> None:
        await ctx.step("same", lambda: 1)
        await ctx.step("same", lambda: 2)

    @bb.pipeline(max_attempts=2)
    async def wandering(ctx: Any) -> None:
        name = "a" if first_run.get("yes") else "b"
        await ctx.step(name, lambda: 1)
        if first_run.pop("yes", False):
            raise RuntimeError("crash after the first step")
        await ctx.step("c", lambda: 1)

    async with bb, running_worker(bb, concurrency=2):
        dup = await bb.wait((await bb.enqueue("twice")).task_id, timeout=30)
        moved = await bb.wait((await bb.enqueue("wandering")).task_id, timeout=30)
    assert dup.status == JobStatus.FAILED and dup.error is not None
    assert dup.error.type == "PipelineDefinitionError" and "used twice" in dup.error.message
    assert moved.status == JobStatus.FAILED and moved.error is not None
    assert "step 1 of the pipeline is 'b' in this run but was 'a' before" in moved.error.message


async def test_a_step_result_that_cannot_be_stored_fails_the_job_at_once(bb: Backburner) -> None:
    runs: Counter[str] = Counter()

    def tags() -> set[str]:
        runs["tags"] += 1
        return {"not", "json"}

    def deep() -> list[Any]:  # as deep as a stored value may be: its step record is deeper
        runs["deep"] += 1
        value: Any = 0
        for _ in range(192):
            value = [value]
        return list(value)

    @bb.pipeline(max_attempts=3)
    async def tagging(ctx: Any) -> None:
        await ctx.step("tags", tags)

    @bb.pipeline(max_attempts=3)
    async def nesting(ctx: Any) -> None:
        await ctx.step("deep", deep)

    async with bb, running_worker(bb, concurrency=1):
        done = await bb.wait((await bb.enqueue("tagging")).task_id, timeout=30)
        nested = await bb.wait((await bb.enqueue("nesting")).task_id, timeout=30)
    for job, step in ((done, "tags"), (nested, "deep")):
        assert job.status == JobStatus.FAILED and job.error is not None
        assert (job.error.type, job.error.retryable) == ("invalid_result", False)
        assert f"the result of step {step!r}" in job.error.message
        assert job.attempts == 1 and runs[step] == 1  # the same result again would not help


async def test_the_last_child_wakes_its_parent_without_waiting_for_a_poll(
    bb: Backburner,
) -> None:
    bb.settings = bb.settings.replace(pipeline_poll_s=300.0)  # no poll could finish it in time

    @bb.task
    async def quick(ctx: JobContext, n: int) -> int:
        await asyncio.sleep(0.05 * n)
        return n

    @bb.pipeline
    async def parent(ctx: Any) -> list[int]:
        first = await ctx.map("one", quick, [1, 2, 3])
        return list(await ctx.map("two", quick, first))

    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("parent")
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.result == [1, 2, 3]


async def test_a_caught_wait_is_a_clear_error_not_a_result(bb: Backburner) -> None:
    gate = asyncio.Event()

    @bb.task
    async def held(ctx: JobContext, n: int) -> int:
        await gate.wait()
        return n

    @bb.pipeline(max_attempts=1)
    async def sloppy(ctx: Any) -> str:
        try:
            await ctx.map("held", held, [1, 2])
        except Exception:  # catches the wait of ctx.map too
            return "made without the children"
        return "done"

    async with bb, running_worker(bb, concurrency=4):
        job = await bb.wait((await bb.enqueue("sloppy")).task_id, timeout=20)
        gate.set()
    assert job.status == JobStatus.FAILED and job.error is not None
    assert job.error.type == "PipelineDefinitionError" and "Suspend" in job.error.message


async def test_a_child_failing_fails_the_parent_at_once_and_stops_its_siblings(
    bb: Backburner,
) -> None:
    @bb.task(max_attempts=1)
    async def work(ctx: JobContext, n: int) -> int:
        if n == 0:
            raise PermanentError("source unreachable")
        await asyncio.sleep(60)
        return n

    @bb.pipeline
    async def parent(ctx: Any) -> list[int]:
        return list(await ctx.map("work", work, [0, 1, 2]))

    # No poll could do it in time: the failed child wakes its parent (it waited for its
    # siblings' end, or its next poll, and they ran to completion).
    bb.settings = bb.settings.replace(pipeline_poll_s=300.0)
    async with bb, running_worker(bb, concurrency=4):
        job = await bb.wait((await bb.enqueue("parent")).task_id, timeout=20)
        children = (await bb.list(parent_id=job.task_id)).jobs
    assert job.status == JobStatus.FAILED and job.error is not None
    assert "work[0]" in job.error.message
    assert sorted(c.status for c in children) == [
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.FAILED,
    ]


async def test_a_child_of_an_ended_parent_is_cancelled_as_it_starts(bb: Backburner) -> None:
    ran: list[str] = []

    @bb.task
    async def child(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    @bb.task
    async def parent(ctx: JobContext) -> None:
        return None

    async with bb:
        owner = await bb.enqueue("parent", delay=3600)
        await bb.cancel(owner.task_id)
        late = await bb.enqueue("child", parent_id=owner.task_id)  # made after the cascade
        async with running_worker(bb, concurrency=1):
            done = await bb.wait(late.task_id, timeout=20)
    assert done.status == JobStatus.CANCELLED and ran == []


async def test_a_parent_that_fails_takes_its_open_children_with_it(bb: Backburner) -> None:
    @bb.task
    async def child(ctx: JobContext) -> None:
        return None

    @bb.task(max_attempts=1)
    async def parent(ctx: JobContext) -> None:
        for _ in range(3):
            await bb.enqueue("child", parent_id=ctx.job_id, delay=3600)
        raise PermanentError("gave up")

    async with bb, running_worker(bb, concurrency=1):
        failed = await bb.wait((await bb.enqueue("parent")).task_id, timeout=20)

        async def all_cancelled() -> bool:
            kids = (await bb.list(parent_id=failed.task_id)).jobs
            return len(kids) == 3 and {k.status for k in kids} == {JobStatus.CANCELLED}

        await eventually(all_cancelled, message="children cancelled")
    assert failed.status == JobStatus.FAILED


async def test_a_child_is_not_deleted_while_its_parent_runs_nor_replayed_after_it(
    bb: Backburner,
) -> None:
    release = asyncio.Event()

    @bb.task(max_attempts=1)
    async def quick(ctx: JobContext, n: int) -> int:
        if n == 2:
            raise PermanentError("this one fails")
        if n == 1:
            await release.wait()
        return n

    @bb.pipeline
    async def fan(ctx: Any) -> list[Any]:
        return list(await ctx.map("all", quick, [0, 1, 2], partial=True))

    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("fan")

        async def children() -> dict[int, Job]:
            listed = await bb.list(parent_id=job.task_id, limit=10)
            return {child.input["n"]: child for child in listed.jobs}

        async def two_ended() -> bool:
            found = await children()
            return len(found) == 3 and found[0].is_terminal and found[2].is_terminal

        await eventually(two_ended, message="children 0 and 2 ended")
        found = await children()
        with pytest.raises(InvalidTransitionError, match=r"which is (queued|processing)"):
            await bb.delete(found[0].task_id)
        release.set()
        done = await bb.wait(job.task_id, timeout=30)
        assert done.status == JobStatus.COMPLETED and done.result == [0, 1, None]
        with pytest.raises(InvalidTransitionError, match="which is completed"):
            await bb.replay(found[2].task_id)
        await bb.delete(found[0].task_id)  # the parent has ended: now it may go
    assert len((await bb.list(parent_id=job.task_id, limit=10)).jobs) == 2


async def test_a_replayed_pipeline_runs_again_the_children_its_failure_ended(
    bb: Backburner,
) -> None:
    # A replay found the failed child failed again and failed at once: a pipeline failed by a
    # child could never be replayed, nor the child on its own (its parent had ended).
    runs: Counter[int] = Counter()
    fails_left = {1: 2}
    gate = asyncio.Event()

    @bb.task(max_attempts=1)
    async def work(ctx: JobContext, n: int) -> int:
        runs[n] += 1
        if fails_left.get(n, 0) > 0:
            fails_left[n] -= 1
            raise PermanentError(f"{n} fails")
        if n == 2:
            await gate.wait()  # still open when its sibling fails: the failure cancels it
        return n * 10

    @bb.pipeline
    async def fan(ctx: Any) -> list[int]:
        return list(await ctx.map("all", work, [0, 1, 2]))

    async def children() -> dict[int, Job]:
        listed = await bb.list(parent_id=job.task_id, limit=10)
        return {child.input["n"]: child for child in listed.jobs}

    async def all_ended() -> bool:
        found = await children()
        return len(found) == 3 and all(child.is_terminal for child in found.values())

    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("fan")
        failed = await bb.wait(job.task_id, timeout=30)
        assert failed.status == JobStatus.FAILED and failed.error is not None
        assert "1 fails" in failed.error.message
        await eventually(all_ended, message="the children ended")
        first = await children()
        assert {n: c.status for n, c in first.items()} == {
            0: JobStatus.COMPLETED,
            1: JobStatus.FAILED,
            2: JobStatus.CANCELLED,
        }
        with pytest.raises(InvalidTransitionError, match=r"which is failed.*replay that one"):
            await bb.replay(first[1].task_id)
        gate.set()

        # The first replay runs 1 and 2 again; 1 fails again, and so does the pipeline: once
        # per replay, not over and over.
        await bb.replay(job.task_id)
        again = await bb.wait(job.task_id, timeout=30)
        assert again.status == JobStatus.FAILED and again.error is not None
        assert "1 fails" in again.error.message
        assert runs[1] == 2
        await eventually(all_ended, message="the children ended again")

        await bb.replay(job.task_id)
        done = await bb.wait(job.task_id, timeout=30)
        last = await children()
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result == [0, 10, 20]
    assert runs[0] == 1 and runs[1] == 3  # a completed child keeps its result
    assert {n: c.task_id for n, c in last.items()} == {n: c.task_id for n, c in first.items()}
    assert {c.status for c in last.values()} == {JobStatus.COMPLETED}
    reruns = [e.data for e in await bb.events(job.task_id) if e.type == "rerun"]
    assert reruns[0] == {"name": "all", "children": [first[1].task_id, first[2].task_id]}
    assert len(reruns) == 2 and first[1].task_id in reruns[1]["children"]


async def test_the_cascade_of_a_failure_stops_once_the_parent_is_replayed(
    bb: Backburner,
) -> None:
    # A replay (its run) runs again the children that had failed or been cancelled: the
    # cascade of the earlier failure, still paging through the children, must not cancel them.
    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    async with bb:
        parent = await bb.enqueue("noop")
        kids = [await bb.enqueue("noop", parent_id=parent.task_id) for _ in range(3)]
        await cancel_children(bb, parent.task_id, while_failed=True)  # queued: not failed
        assert {(await bb.get(k.task_id)).status for k in kids} == {JobStatus.QUEUED}
        await cancel_children(bb, parent.task_id)
        assert {(await bb.get(k.task_id)).status for k in kids} == {JobStatus.CANCELLED}


async def test_a_cascade_cancels_the_running_children_before_the_queued_ones(
    bb: Backburner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The running ones spend tokens: a batch's 50 went on streaming for 6 s while its 9,950
    # queued requests were cancelled first.
    @bb.task
    async def noop(ctx: JobContext) -> None:
        return None

    @bb.task
    async def kid(ctx: JobContext) -> None:
        return None

    async with bb:
        parent = await bb.enqueue("noop")
        kids = [await bb.enqueue("kid", parent_id=parent.task_id) for _ in range(6)]
        running = await bb.backend.claim(
            "w1", limit=2, now=kids[-1].created_at, lease_s=60, types=["kid"]
        )
        assert len(running) == 2
        order: list[str] = []
        cancel = bb.cancel

        async def noting(task_id: str, **kwargs: Any) -> Job:
            order.append(task_id)
            return await cancel(task_id, **kwargs)

        monkeypatch.setattr(bb, "cancel", noting)
        await cancel_children(bb, parent.task_id)
        assert set(order[:2]) == {j.task_id for j in running}
        assert sorted(order) == sorted(k.task_id for k in kids)
        assert {(await bb.get(k.task_id)).status for k in kids} == {JobStatus.CANCELLED}


async def test_a_pipelines_usage_counts_the_calls_of_every_run(bb: Backburner) -> None:
    # Only the last run's usage was stored: a research question's plan call, made before it
    # parked for its searches, was in neither its usage nor the token metrics.
    @bb.task
    async def child(ctx: JobContext, n: int) -> int:
        return n

    @bb.pipeline
    async def spend(ctx: Any) -> int:
        def plan() -> int:
            ctx.add_usage(input_tokens=10, output_tokens=5, calls=1)
            return 1

        await ctx.step("plan", plan)
        found = await ctx.map("work", child, [1, 2])  # parks: the next run goes on from here
        ctx.add_usage(input_tokens=7, output_tokens=3, calls=ctx.usage.get("calls", 0) + 1)
        return int(sum(found))

    async with bb, running_worker(bb, concurrency=2):
        job = await bb.enqueue("spend")
        done = await bb.wait(job.task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.usage is not None
    assert done.usage.model_dump() == {"input_tokens": 17, "output_tokens": 8, "calls": 2}
    assert done.attempts == 1


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_map_bigger_than_the_queue_waits_for_room(kind: str, tmp_path: Path) -> None:
    # A map that hit max_queue_size failed its pipeline (3 attempts in 4 s), cancelling the
    # children it had made: a batch of 1,000 requests under a bound of 50.
    engine = make_backend(kind, tmp_path, max_queue_size=5)
    settings = WORKER_TEST_SETTINGS.replace(pipeline_poll_s=0.2, max_queue_size=5)
    bb = Backburner(engine, settings=settings)

    @bb.task
    async def square(ctx: JobContext, n: int) -> int:
        return n * n

    @bb.pipeline(max_attempts=1)
    async def fan(ctx: Any) -> list[int]:
        return list(await ctx.map("squares", square, list(range(20))))

    try:
        async with bb, running_worker(bb, concurrency=3):
            job = await bb.enqueue("fan")
            done = await bb.wait(job.task_id, timeout=60)
            children = await bb.list(parent_id=job.task_id, limit=100)
    finally:
        await drop_redis_keys(engine)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result == [n * n for n in range(20)] and done.attempts == 1
    assert len(children.jobs) == 20  # each made once, whatever the runs


async def test_maps_facing_a_full_queue_with_no_children_of_their_own_do_not_wait_for_ever(
    tmp_path: Path,
) -> None:
    # Parked pipelines count as queued: pipelines waiting for room, none with a child of its
    # own running, filled the queue for ever, each parking again at every poll (a review:
    # 4 pipelines, max_queue_size 2, 35 runs each in 8 s, no child made, no new job admitted).
    engine = make_backend("sqlite", tmp_path, max_queue_size=2)
    bb = Backburner(engine, settings=WORKER_TEST_SETTINGS.replace(pipeline_poll_s=0.2))

    @bb.task
    async def square(ctx: JobContext, n: int) -> int:
        return n * n

    @bb.pipeline(max_attempts=2)
    async def fan(ctx: Any) -> list[int]:
        await ctx.step("think", asyncio.sleep, 0.5)
        return list(await ctx.map("squares", square, [1, 2]))

    async with bb:
        jobs = [await bb.enqueue("fan") for _ in range(2)]
    async with bb, running_worker(bb, concurrency=2):
        for _ in range(2):  # two more as the first two run: the queue holds 2 (max_queue_size)
            await eventually(
                lambda: _admitted(bb, "fan"), message="room for another pipeline", timeout=30
            )
            jobs.append(await bb.enqueue("fan"))
        done = [await bb.wait(job.task_id, timeout=60) for job in jobs]
    assert {d.status for d in done} <= {JobStatus.COMPLETED, JobStatus.FAILED}
    assert all(len(d.history) <= 12 for d in done), [len(d.history) for d in done]
    for failed in (d for d in done if d.status == JobStatus.FAILED):
        assert failed.error is not None and failed.error.type == "QueueFullError"


async def _admitted(bb: Backburner, task: str) -> bool:
    stats = await bb.backend.stats(now=bb.clock.now())
    return stats.counts[JobStatus.QUEUED] < 2


async def test_a_pipelines_usage_outlives_a_hand_back_within_its_attempt(
    bb: Backburner,
) -> None:
    # A run handed back (a shutdown) does not charge the attempt, but the run after it
    # started its usage from nothing: the calls before the park were lost again.
    after_map = 0
    hold = asyncio.Event()

    @bb.task
    async def child(ctx: JobContext, n: int) -> int:
        return n

    @bb.pipeline
    async def spend(ctx: Any) -> int:
        nonlocal after_map

        def plan() -> int:
            ctx.add_usage(input_tokens=10, output_tokens=5)
            return 1

        await ctx.step("plan", plan)
        found = await ctx.map("work", child, [1, 2])
        after_map += 1
        if after_map == 1:
            hold.set()
            await asyncio.sleep(60)  # handed back by the shutdown below (Release)
        ctx.add_usage(input_tokens=7, output_tokens=3)
        return int(sum(found))

    quick = bb.settings.replace(shutdown_grace_s=0.2)
    async with bb:
        bb.settings = quick
        async with running_worker(bb, concurrency=2):
            job = await bb.enqueue("spend")
            await asyncio.wait_for(hold.wait(), 20)
        released = await bb.get(job.task_id)
        # (parked for its children first, unless they were done before it looked)
        assert released.history[-1].outcome == "released", released.history
        async with running_worker(bb, concurrency=2):
            done = await bb.wait(job.task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED and done.attempts == 1, done.error
    assert done.usage is not None
    assert done.usage.model_dump() == {"input_tokens": 17, "output_tokens": 8}


async def test_a_suspended_job_without_children_waits_out_its_time(bb: Backburner) -> None:
    # It was woken at once, every time: 560-1,440 runs in 8 s, a core's worth of CPU.
    runs: list[float] = []

    @bb.task
    async def later(ctx: JobContext) -> int:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) == 1:
            raise Suspend("not yet", after=1.5)
        return len(runs)

    async with bb, running_worker(bb, concurrency=2):
        done = await bb.wait((await bb.enqueue("later")).task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.result == 2 and done.attempts == 1
    assert runs[1] - runs[0] >= 1.4


def _gated_fan_out(bb: Backburner, gate: asyncio.Event, looks: list[float] | None = None) -> None:
    """Registers ``parent``, a pipeline that maps two children of ``held``, which wait for
    ``gate``; each run of the parent notes its loop time in ``looks``, if given."""

    @bb.task
    async def held(ctx: JobContext, n: int) -> int:
        await gate.wait()
        return n

    @bb.pipeline
    async def parent(ctx: Any) -> list[int]:
        if looks is not None:
            looks.append(asyncio.get_running_loop().time())
        return list(await ctx.map("held", held, [1, 2]))


async def test_a_deadline_ends_a_pipeline_that_waits_for_its_children(bb: Backburner) -> None:
    # It waited for its children (or its poll) and failed after their work was done.
    bb.settings = bb.settings.replace(pipeline_poll_s=300.0)
    gate = asyncio.Event()
    _gated_fan_out(bb, gate)

    try:
        async with bb, running_worker(bb, concurrency=4):
            started = asyncio.get_running_loop().time()
            job = await bb.enqueue("parent", deadline=1.0)
            done = await bb.wait(job.task_id, timeout=20)
            took = asyncio.get_running_loop().time() - started
            children = (await bb.list(parent_id=job.task_id)).jobs
    finally:
        gate.set()
    assert done.status == JobStatus.FAILED and done.error is not None
    assert done.error.type == "deadline_exceeded" and "while it waited" in done.error.message
    assert took < 10
    assert [c.status for c in children] == [JobStatus.CANCELLED] * 2


async def test_a_step_inside_a_step_and_a_map_inside_a_step_replay_in_order(
    bb: Backburner,
) -> None:
    # Steps were matched by the order they ended in, so a nested one (which ends before the
    # step around it) failed the next run with a false "step 2 is 'inner' ... was 'outer'".
    runs: Counter[str] = Counter()
    broken = {"outer": 1}

    @bb.task
    async def double(ctx: JobContext, n: int) -> int:
        return 2 * n

    @bb.pipeline(max_attempts=3)
    async def nested(ctx: Any) -> dict[str, Any]:
        async def outer() -> int:
            runs["outer"] += 1
            inner = await ctx.step("inner", lambda: 20)
            doubled = await ctx.map("twice", double, [{"n": inner}])
            if broken["outer"]:
                broken["outer"] -= 1
                raise RuntimeError("the outer step fell over after its inner ones")
            return int(doubled[0]) + 1

        first = await ctx.step("outer", outer)
        return {"first": first, "after": await ctx.step("after", lambda: "done")}

    @bb.pipeline
    async def reused(ctx: Any) -> str:
        # (a review's case: "outer" is taken from its record the next run, so "inner" is not
        # called again, and the step after the map came at another place than before)
        async def outer() -> int:
            return int(await ctx.step("inner", lambda: 20)) + 1

        first = await ctx.step("outer", outer)
        await ctx.map("m", double, [{"n": first}])
        return str(await ctx.step("after", lambda: "ok"))

    async with bb, running_worker(bb, concurrency=2):
        done = await bb.wait((await bb.enqueue("nested")).task_id, timeout=30)
        other = await bb.wait((await bb.enqueue("reused")).task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result == {"first": 41, "after": "done"} and runs["outer"] >= 2
    assert other.status == JobStatus.COMPLETED and other.result == "ok", other.error


async def test_a_plain_function_step_that_blocks_holds_no_other_job(bb: Backburner) -> None:
    # On the event loop, a blocking step (a sync SDK's call) held every job of the worker: a
    # review's cancel of another job waited 5.5 s for it.
    release = threading.Event()
    ended: list[float] = []

    def blocking() -> str:
        release.wait(10)
        ended.append(time.time())
        return "done"

    @bb.pipeline
    async def slow(ctx: Any) -> str:
        return str(await ctx.step("work", blocking))

    @bb.task
    async def quick(ctx: JobContext) -> str:
        return "quick"

    async with bb, running_worker(bb, concurrency=2):
        pipeline = await bb.enqueue("slow")
        await eventually(lambda: _started(bb, pipeline.task_id), timeout=20)
        other = await bb.wait((await bb.enqueue("quick")).task_id, timeout=20)
        release.set()
        done = await bb.wait(pipeline.task_id, timeout=20)
    assert other.status == JobStatus.COMPLETED and done.result == "done"
    assert other.finished_at is not None and other.finished_at < ended[0]


async def _started(bb: Backburner, task_id: str) -> bool:
    return (await bb.get(task_id)).status == JobStatus.PROCESSING


async def test_a_step_retry_waits_for_a_retry_after_and_hands_a_long_one_to_the_job(
    bb: Backburner,
) -> None:
    calls: list[float] = []

    def limited() -> str:  # (a plain function: it runs in a thread, with no event loop)
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise Retry("429", after=1.0)  # within cap_s: waited for in place
        if len(calls) == 2:
            raise Retry("429 for a while", after=600.0)  # beyond it: the job's own retry
        return "ok"

    @bb.pipeline(max_attempts=2)
    async def polite(ctx: Any) -> str:
        return str(await ctx.step("call", limited, retry=StepRetry(attempts=3, backoff_s=0.1)))

    async with bb, running_worker(bb, concurrency=2):
        job = await bb.enqueue("polite")
        await eventually(lambda: _attempts(bb, job.task_id, 2), timeout=20)
        parked = await bb.get(job.task_id)
    assert calls[1] - calls[0] >= 0.95  # not the 0.1 s backoff
    assert len(calls) == 2 and parked.status == JobStatus.QUEUED  # retried later, as asked
    assert parked.run_at - parked.history[-1].finished_at >= 590  # type: ignore[operator]


async def _attempts(bb: Backburner, task_id: str, count: int) -> bool:
    job = await bb.get(task_id)
    return len(job.history) >= 1 and job.status == JobStatus.QUEUED and len(job.history) < count


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("unknown_task", "unknown task 'no_such_task'"),
        ("bad_item", "'squares'[2]:"),
        ("metadata", "one metadata dict per item"),
        ("priority", "priority"),
        ("own_key", "idempotency_key cannot be given"),
    ],
)
async def test_a_mistake_in_a_map_fails_the_pipeline_at_once_with_no_child(
    bb: Backburner, how: str, says: str
) -> None:
    # Each was retried as if it might pass (3 attempts, with backoff), and a bad item came
    # after its siblings had been enqueued.
    @bb.task
    async def add(ctx: JobContext, a: int, b: int) -> int:
        return a + b

    @bb.pipeline(max_attempts=3)
    async def sloppy(ctx: Any) -> list[int]:
        items: list[Any] = [{"a": 1, "b": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 3}]
        options: dict[str, Any] = {}
        task: Any = add
        if how == "unknown_task":
            task = "no_such_task"
        elif how == "bad_item":
            items[2] = {"a": 3}  # no b
        elif how == "metadata":
            options["metadata"] = [{}]
        elif how == "priority":
            options["priority"] = 1000
        else:
            options["idempotency_key"] = "mine"
        return list(await ctx.map("squares", task, items, **options))

    async with bb, running_worker(bb, concurrency=2):
        done = await bb.wait((await bb.enqueue("sloppy")).task_id, timeout=30)
        children = (await bb.list(parent_id=done.task_id)).jobs
    assert done.status == JobStatus.FAILED and done.attempts == 1
    assert done.error is not None and done.error.type == "PipelineDefinitionError"
    assert says in done.error.message, done.error.message
    assert children == []


async def test_a_map_named_with_a_long_name_runs(bb: Backburner) -> None:
    @bb.task
    async def echo(ctx: JobContext, n: int) -> int:
        return n

    name = "https://example.com/" + "very/long/path/" * 30  # a URL as a name: 470 characters

    @bb.pipeline
    async def crawl(ctx: Any) -> list[int]:
        return list(await ctx.map(name, echo, [1, 2]))

    async with bb, running_worker(bb, concurrency=2):
        done = await bb.wait((await bb.enqueue("crawl")).task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED and done.result == [1, 2], done.error


async def test_a_pipeline_whose_children_change_nothing_looks_less_and_less_often(
    bb: Backburner,
) -> None:
    # Each look is a run with its own attempt record: a day on slow children made 17,000.
    bb.settings = bb.settings.replace(pipeline_poll_s=0.1)
    gate = asyncio.Event()
    looks: list[float] = []
    _gated_fan_out(bb, gate, looks)

    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("parent")
        await eventually(lambda: len(looks) >= 5, timeout=20, message="five looks")
        gate.set()
        done = await bb.wait(job.task_id, timeout=20)
    assert done.status == JobStatus.COMPLETED and done.result == [1, 2]
    gaps = [b - a for a, b in itertools.pairwise(looks[:5])]
    assert gaps[3] >= 0.5, gaps  # 0.1, 0.2, 0.4, 0.8: not 0.1 each time


async def test_failing_children_of_a_partial_map_do_not_wake_their_parent_each(
    bb: Backburner,
) -> None:
    # After review: each failure woke the parent, which read every child: 101 runs for 200
    # children, half of them failing, against 2.
    bb.settings = bb.settings.replace(pipeline_poll_s=300.0)
    runs: list[int] = []

    @bb.task(max_attempts=1)
    async def maybe(ctx: JobContext, n: int) -> int:
        if n % 2:
            raise PermanentError(f"odd {n}")
        return n

    @bb.pipeline
    async def tolerant(ctx: Any) -> int:
        runs.append(1)
        found = await ctx.map("maybe", maybe, list(range(40)), partial=True)
        return sum(1 for r in found if r is None)

    async with bb, running_worker(bb, concurrency=8):
        done = await bb.wait((await bb.enqueue("tolerant")).task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED and done.result == 20
    assert len(runs) <= 4, len(runs)  # the first, the last child's wake (and a race or two)


async def test_a_capped_tenants_children_are_lowered_to_its_cap_never_refused(
    bb: Backburner,
) -> None:
    from backburner.tenants import TenantPolicies

    bb.tenants = TenantPolicies.from_source(
        '{"tenants": {"acme": {"max_in_flight": 0, "max_priority": 0}}}'
    )

    @bb.task(priority=100)  # its own default: above the cap
    async def urgent(ctx: JobContext, n: int) -> int:
        return n

    @bb.pipeline
    async def fan(ctx: Any) -> list[int]:
        first = await ctx.map("a", urgent, [1])
        return list(first) + list(await ctx.map("b", urgent, [2], priority=50))

    async with bb, running_worker(bb, concurrency=4):
        done = await bb.wait((await bb.enqueue("fan", tenant="acme")).task_id, timeout=30)
        children = (await bb.list(parent_id=done.task_id)).jobs
    assert done.status == JobStatus.COMPLETED and done.result == [1, 2], done.error
    assert sorted(c.priority for c in children) == [0, 0]


async def test_a_step_retried_in_place_may_call_its_steps_again(bb: Backburner) -> None:
    # Its inner steps were "used twice in one run", a permanent failure.
    calls: Counter[str] = Counter()

    def flaky() -> int:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise RuntimeError("transient")
        return 5

    @bb.pipeline
    async def retried(ctx: Any) -> int:
        async def outer() -> int:
            stored = await ctx.step("stored", lambda: calls.update(["stored"]) or 1)
            return int(stored) + int(await ctx.step("inner", flaky))

        return int(await ctx.step("outer", outer, retry=StepRetry(attempts=3, backoff_s=0.01)))

    async with bb, running_worker(bb, concurrency=2):
        done = await bb.wait((await bb.enqueue("retried")).task_id, timeout=30)
    assert done.status == JobStatus.COMPLETED and done.result == 6, done.error
    assert calls == Counter(flaky=2, stored=1)  # the step that ended is not run again


async def test_children_of_a_parent_ended_without_its_cascade_are_stopped_by_their_worker(
    bb: Backburner,
) -> None:
    # The cascade runs in the process that cancels: one that died part-way left the other
    # children running to an end nobody reads.
    gate = asyncio.Event()
    _gated_fan_out(bb, gate)
    try:
        async with bb, running_worker(bb, concurrency=4):
            job = await bb.enqueue("parent")

            async def both_running() -> bool:
                kids = (await bb.list(parent_id=job.task_id)).jobs
                return len(kids) == 2 and all(k.status == JobStatus.PROCESSING for k in kids)

            await eventually(both_running, timeout=20, message="both children running")
            await bb.backend.cancel(job.task_id, now=bb.clock.now())  # no hooks, no cascade

            async def both_cancelled() -> bool:
                kids = (await bb.list(parent_id=job.task_id)).jobs
                return all(k.status == JobStatus.CANCELLED for k in kids)

            await eventually(both_cancelled, timeout=20, message="children cancelled")
    finally:
        gate.set()
