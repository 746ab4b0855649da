"""The app that worker subprocesses in tests run: ``backburner worker tests.workerapp:bb``."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from backburner import Backburner, JobContext, Settings

bb = Backburner(settings=Settings.from_env())


def _mark(marker_dir: str | None, task_id: str, line: str) -> None:
    if marker_dir is not None:
        with (Path(marker_dir) / task_id).open("a") as f:
            f.write(line + "\n")


@bb.task(max_attempts=5)
async def sleepy(
    ctx: JobContext,
    seconds: float,
    marker_dir: str | None = None,
    retry_seconds: float | None = None,
) -> dict[str, Any]:
    """Sleeps (``retry_seconds`` from the second attempt on, if given); leaves one 'start'
    line per execution and a 'stop' line with the time it ended."""
    _mark(marker_dir, ctx.job_id, f"start {os.getpid()} {ctx.attempt}")
    if retry_seconds is not None and ctx.attempt > 1:
        seconds = retry_seconds
    try:
        await ctx.emit("tick", {"pid": os.getpid()})
        await asyncio.sleep(seconds)
    finally:
        _mark(marker_dir, ctx.job_id, f"stop {os.getpid()} {time.time()}")
    return {"pid": os.getpid(), "attempt": ctx.attempt}


@bb.task
async def noop(ctx: JobContext) -> None:
    return None


@bb.pipeline(max_attempts=5)
async def four_steps(ctx: Any, marker_dir: str) -> dict[str, Any]:
    """A pipeline whose steps leave a line each time they run; step 3 holds until the file
    ``release`` exists in ``marker_dir`` (so a test can kill the worker in the middle of it)."""

    def record(step: str) -> str:
        _mark(marker_dir, "steps", step)
        return step

    async def held(step: str) -> str:
        record(step)
        while not (Path(marker_dir) / "release").exists():
            await asyncio.sleep(0.05)
        return step

    done = [await ctx.step("one", record, "one"), await ctx.step("two", record, "two")]
    done.append(await ctx.step("three", held, "three"))
    done.append(await ctx.step("four", record, "four"))
    return {"steps": done, "pid": os.getpid()}
