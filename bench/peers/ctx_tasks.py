"""The benchmark's tasks in the shape arq and saq call them: a context dict first.

Both name a job after its function, so these keep the names the producers enqueue.
"""

from __future__ import annotations

from typing import Any

from . import probe


async def noop(ctx: dict[str, Any]) -> None:
    await probe.noop_async()


async def ping(ctx: dict[str, Any]) -> None:
    await probe.ping_async()


async def nap(ctx: dict[str, Any]) -> None:
    await probe.nap_async()
