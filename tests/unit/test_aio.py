"""wait_set: an event wait with a limit that never loses a cancel."""

from __future__ import annotations

import asyncio
import math

import pytest

from backburner.aio import wait_set


async def test_it_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    event.set()
    assert await wait_set(event, 0.01) is True
    assert await wait_set(event, math.inf) is True


async def test_a_set_ends_the_wait_at_once() -> None:
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_set(event, math.inf))
    await asyncio.sleep(0)
    event.set()
    assert await asyncio.wait_for(waiter, 5) is True


async def test_a_cancel_the_waiter_accepts_is_never_lost() -> None:
    # asyncio.wait_for on Python 3.11 returns the result instead when the cancel comes in
    # the loop turn that sets the event (turns=0): the cancelled task would run on.
    for turns in range(4):
        event = asyncio.Event()
        waiter = asyncio.create_task(wait_set(event, 30))
        await asyncio.sleep(0)
        event.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        if waiter.cancel():
            with pytest.raises(asyncio.CancelledError):
                await waiter
        else:
            assert waiter.result() is True
