"""asyncio waits that never lose a cancel.

On Python 3.11, ``asyncio.wait_for`` returns the awaited result when a cancel arrives in the
same loop turn as that result (python/cpython#86296, fixed in 3.12): the cancelled task runs
on, say for the whole of its next wait. ``asyncio.timeout`` has no such window.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Collection
from typing import Any


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds (``math.inf``: no limit) for ``event``; whether it is set."""
    if not event.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if math.isinf(timeout) else timeout):
                await event.wait()
    return event.is_set()


async def wait_all_or(
    tasks: Collection[asyncio.Future[Any]], event: asyncio.Event | None, timeout: float
) -> None:
    """Wait until every one of ``tasks`` is done, ``event`` (if any) is set or ``timeout``
    seconds pass, whichever comes first. The tasks are not cancelled."""
    if not tasks or (event is not None and event.is_set()):
        return
    if event is None:
        await asyncio.wait(tasks, timeout=timeout)
        return
    all_done = asyncio.ensure_future(asyncio.wait(tasks))
    now_set = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait(
            {all_done, now_set}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        all_done.cancel()
        now_set.cancel()


async def done_unless_set(work: asyncio.Future[Any], event: asyncio.Event) -> bool:
    """Wait for ``work`` unless ``event`` is set first; then cancel it (and wait for that).
    Whether ``work`` ended on its own (its result or exception is then there to read)."""
    now_set = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({work, now_set}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        now_set.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    return not work.cancelled()
