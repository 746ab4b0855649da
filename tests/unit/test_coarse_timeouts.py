"""CoarseTimeouts keeps nothing of the attempts it times alive beyond them."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from typing import Any, cast

from backburner.worker.timeouts import CoarseTimeouts

_HELD: contextvars.ContextVar[object] = contextvars.ContextVar("held")


class _Input:
    """Stands for what a job's context holds: its JobContext, the job and its input."""


async def test_a_timer_keeps_no_copy_of_the_context_of_the_job_that_armed_it() -> None:
    # The timer copied the arming job's context, which lived on for the whole timeout (an hour
    # for a batch): a worker running batches kept the input of every one it had ended.
    timeouts = CoarseTimeouts()
    attempt = cast(Any, object())
    gone: list[weakref.ref[_Input]] = []

    async def run() -> None:
        held = _Input()
        gone.append(weakref.ref(held))
        _HELD.set(held)
        slot = timeouts.arm(attempt, 3600)
        timeouts.disarm(attempt, slot)

    await asyncio.create_task(run())
    await asyncio.sleep(0)  # (the loop lets go of the ended task at its next turn)
    gc.collect()
    assert gone[0]() is None
