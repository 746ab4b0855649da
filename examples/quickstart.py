"""A producer and a worker in separate processes, sharing one SQLite file.

backburner worker examples.quickstart:bb          # terminal 1: the worker
python -m examples.quickstart "some long text"     # terminal 2: enqueue and wait
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from backburner import Backburner, JobContext, Retry

bb = Backburner("sqlite:///backburner.db")


@bb.task(max_attempts=5, timeout=120)
async def summarize(ctx: JobContext, text: str) -> dict[str, Any]:
    """A stand-in for an LLM call: reports progress, streams words, retries once."""
    if ctx.attempt == 1 and text.startswith("flaky"):
        raise Retry("simulated 429 from the model", after=0.5)
    words = text.split()
    for i, word in enumerate(words, 1):
        await ctx.emit("token", {"text": word})
        await ctx.progress(100 * i / len(words), f"{i}/{len(words)} words")
        await asyncio.sleep(0.05)
    ctx.add_usage(input_tokens=len(words), output_tokens=min(len(words), 5))
    return {"summary": " ".join(words[:5])}


async def main(text: str) -> None:
    job = await bb.enqueue("summarize", {"text": text})
    print("enqueued", job.task_id)
    done = await bb.wait(job.task_id, timeout=300)
    print(done.status.value, done.result, f"attempts={done.attempts}")
    await bb.close()


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "flaky text to summarize in a few words"))
