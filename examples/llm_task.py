"""A task that calls a model through ``ctx.llm``: routed, limited, streamed and accounted.

BACKBURNER_MODELS=examples/models-local-servers.toml backburner worker examples.llm_task:bb
python -m examples.llm_task "Why do leases need fencing tokens?"
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from backburner import Backburner, JobContext

bb = Backburner("sqlite:///backburner.db")


@bb.task(max_attempts=3, timeout=600)
async def answer_twice(ctx: JobContext, question: str, model: str | None = None) -> dict[str, Any]:
    """Draft an answer, then shorten it: two calls, one job, one usage record."""
    draft = await ctx.llm.generate(
        messages=[{"role": "user", "content": question}], model=model, max_tokens=200
    )
    short = await ctx.llm.generate(
        messages=[
            {"role": "system", "content": "Rewrite the text in one sentence."},
            {"role": "user", "content": draft.text},
        ],
        model=model,
        max_tokens=60,
    )
    return {"draft": draft.text, "answer": short.text, "model": short.model}


async def main(question: str) -> None:
    async with bb:
        job = await bb.enqueue("answer_twice", {"question": question})
        done = await bb.wait(job.task_id, timeout=600)
        print(done.status.value, done.result, done.usage)


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "What is a lease?"))
