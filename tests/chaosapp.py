"""The app chaos-test workers run: ``backburner worker tests.chaosapp:bb`` (see tests/chaos).

Every execution leaves lines in ``<marker_dir>/<task_id>`` (one ``write`` per line, appended):

    start <pid> <attempt> <fence> <time>
    stop <pid> <fence> <time>               (not written when the process is SIGKILLed)
    emit-try|emit-rejected|cancelled <pid> <fence> <time>   (stubborn jobs only)
    emit-ok <pid> <fence> <seq> <time>                      (the event's seq in the job's log)

so a test can count executions, see which were interrupted and which writes a stale attempt
tried, without trusting the backend it is checking.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from backburner import Backburner, JobContext, Settings
from backburner.errors import LeaseLostError

T = TypeVar("T")

bb = Backburner(settings=Settings.from_env())


def _mark(marker_dir: str, task_id: str, kind: str, *fields: object) -> None:
    line = " ".join([kind, *(str(f) for f in fields), repr(time.time())]) + "\n"
    fd = os.open(os.path.join(marker_dir, task_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@bb.task(max_attempts=100)
async def chaos(
    ctx: JobContext,
    seconds: float,
    marker_dir: str,
    stubborn: bool = False,
    tick_s: float = 0.1,
) -> dict[str, Any]:
    """Sleep ``seconds``; return who ran it. ``stubborn``: ignore cancellation (see below)."""
    pid = os.getpid()
    fence = ctx.fence
    _mark(marker_dir, ctx.job_id, "start", pid, ctx.attempt, fence)
    if stubborn:
        await _stubborn_body(ctx, seconds, marker_dir, tick_s)
    else:
        await ctx.emit("tick", {"pid": pid, "fence": fence, "phase": "start"})
        try:
            await asyncio.sleep(seconds)
        finally:
            _mark(marker_dir, ctx.job_id, "stop", pid, fence)
    return {"pid": pid, "fence": fence, "attempt": ctx.attempt}


async def _stubborn_body(ctx: JobContext, seconds: float, marker_dir: str, tick_s: float) -> None:
    """A handler that ignores the worker's lease-lost cancel and keeps writing: the worst case
    for fencing. Only the backend's fence check can stop its events and its result."""
    pid, fence, task_id = os.getpid(), ctx.fence, ctx.job_id

    async def deaf(waitable: Awaitable[T]) -> T:
        inner = asyncio.ensure_future(waitable)
        while True:
            try:
                return await asyncio.shield(inner)
            except asyncio.CancelledError:
                if inner.done():
                    return inner.result()
                _mark(marker_dir, task_id, "cancelled", pid, fence)

    async def write(phase: str) -> bool:
        _mark(marker_dir, task_id, "emit-try", pid, fence)
        try:
            seq = await deaf(ctx.emit("tick", {"pid": pid, "fence": fence, "phase": phase}))
        except LeaseLostError:
            _mark(marker_dir, task_id, "emit-rejected", pid, fence)
            return False
        _mark(marker_dir, task_id, "emit-ok", pid, fence, seq)
        return True

    end = time.monotonic() + seconds
    await write("start")  # refused or not, carry on: a stubborn handler does not give up
    while time.monotonic() < end:
        await deaf(asyncio.sleep(min(tick_s, max(0.0, end - time.monotonic()))))
        if time.monotonic() < end and not await write("run"):
            break
    await write("end")
    _mark(marker_dir, task_id, "stop", pid, fence)
