"""Tasks for bench/http_api.py (`backburner api bench.httpapp:bb`, `... worker ...`)."""

from __future__ import annotations

import asyncio

from backburner import Backburner, JobContext, Settings

bb = Backburner(settings=Settings.from_env())


@bb.task(max_attempts=1)
async def nap(ctx: JobContext, seconds: float = 0.0) -> None:
    await asyncio.sleep(seconds)
