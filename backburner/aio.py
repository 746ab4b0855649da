"""asyncio waits that never lose a cancel.

On Python 3.11, ``asyncio.wait_for`` returns the awaited result when a cancel arrives in the
same loop turn as that result (python/cpython#86296, fixed in 3.12): the cancelled task runs
on, say for the whole of its next wait. ``asyncio.timeout`` has no such window.
"""

from __future__ import annotations

import asyncio
import contextlib
import math


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds (``math.inf``: no limit) for ``event``; whether it is set."""
    if not event.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if math.isinf(timeout) else timeout):
                await event.wait()
    return event.is_set()
