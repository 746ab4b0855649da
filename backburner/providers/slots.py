"""A model's ``max_concurrent``, held across every worker process through the backend.

A call takes a leased slot before it starts and gives it back after; the lease is renewed while
the call runs, so a worker that dies frees its slots within one lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..errors import BackendError

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..clock import Clock

log = logging.getLogger("backburner.providers")

_FIRST_WAIT_S = 0.01
_LONGEST_WAIT_S = 0.25


def slot_key(model: str) -> str:
    return f"model:{model}"


@contextlib.asynccontextmanager
async def model_slot(
    backend: Backend,
    clock: Clock,
    model: str,
    limit: int,
    *,
    owner: str,
    lease_s: float,
    renew_s: float,
) -> AsyncIterator[None]:
    """Hold one of ``limit`` slots of ``model`` for the body; waits while all are taken."""
    key = slot_key(model)
    holder = f"{owner}:{uuid.uuid4().hex[:12]}"
    wait = _FIRST_WAIT_S
    try:
        while not await backend.acquire_slot(
            key, holder, limit=limit, lease_s=lease_s, now=clock.now()
        ):
            # Jittered so that waiters on many workers do not retry in step.
            await asyncio.sleep(wait * random.uniform(0.5, 1.0))
            wait = min(_LONGEST_WAIT_S, wait * 2)
    except BaseException:
        # Cancelled while an acquire was in flight: it may still have taken the slot.
        await _release(backend, key, holder)
        raise
    renewer = asyncio.create_task(_renew(backend, clock, key, holder, lease_s, renew_s))
    try:
        yield
    finally:
        renewer.cancel()
        # Not `await renewer`: that would also swallow a cancel of this task landing there.
        await asyncio.wait([renewer])
        if not renewer.cancelled() and renewer.exception() is not None:
            log.warning("the slot renewer of %s stopped: %r", key, renewer.exception())
        await _release(backend, key, holder)


async def _release(backend: Backend, key: str, holder: str) -> None:
    try:
        await asyncio.shield(backend.release_slot(key, holder))
    except BackendError as exc:  # the lease frees it anyway
        log.warning("could not release the slot %s of %s: %s", holder, key, exc)


async def _renew(
    backend: Backend, clock: Clock, key: str, holder: str, lease_s: float, renew_s: float
) -> None:
    while True:
        await asyncio.sleep(renew_s)
        try:
            held = await backend.renew_slot(key, holder, lease_s=lease_s, now=clock.now())
        except BackendError as exc:
            log.warning("could not renew the slot %s of %s: %s", holder, key, exc)
            continue
        if not held:
            # Lost (a long stall): the call goes on, and the limit may be passed by one for
            # as long as it runs; taking the slot again would only wait behind ourselves.
            log.warning("the slot %s of %s expired while its call ran", holder, key)
            return
