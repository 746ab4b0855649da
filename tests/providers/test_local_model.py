"""The real offline model (Gemma 3 270M through llama.cpp), when ``backburner[local]`` is in."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, JobStatus
from backburner.builtin import install_builtin_tasks
from backburner.errors import ContextLengthExceededError
from backburner.providers import GenerationRequest, Message, ModelRouter, Usage
from backburner.providers.local import LocalProvider, chat_prompt, local_available

from ..helpers import WORKER_TEST_SETTINGS, running_worker

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def require_local() -> None:
    if local_available():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but backburner[local] is not installed")
    pytest.skip("backburner[local] is not installed")


def test_chat_messages_become_a_transcript_the_base_model_continues() -> None:
    prompt = chat_prompt(
        (Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello."))
    )
    assert prompt == (
        "Be brief.\n\n"
        "User: What is the capital of France?\nAssistant: The capital of France is Paris.\n"
        "User: Hi\nAssistant: Hello.\nAssistant:"
    )


async def test_the_local_model_writes_real_text_in_a_job(tmp_path: Path) -> None:
    require_local()
    settings = WORKER_TEST_SETTINGS.replace(backend_url=f"sqlite:///{tmp_path / 'jobs.db'}")
    bb = Backburner(settings=settings, models=ModelRouter())
    install_builtin_tasks(bb)
    async with bb, running_worker(bb, concurrency=2):
        job = await bb.enqueue(
            "generate",
            {
                "messages": [{"role": "user", "content": "Who wrote Romeo and Juliet?"}],
                "model": "local",
                "max_tokens": 24,
                "temperature": 0,
            },
        )
        done = await bb.wait(job.task_id, timeout=240)
        tokens = [e.data["text"] for e in await bb.events(job.task_id) if e.type == "token"]
    assert done.status is JobStatus.COMPLETED, done.error
    assert done.result is not None and done.result["provider"] == "local"
    assert done.result["simulated"] is False
    text = done.result["text"]
    assert "Shakespeare" in text, text
    assert "".join(tokens) == text
    usage = done.usage.model_dump() if done.usage else {}
    assert usage["input_tokens"] > 5 and 0 < usage["output_tokens"] <= 24
    assert usage["tokens_per_s"] > 0


async def test_too_long_a_prompt_is_a_context_error_before_any_work() -> None:
    require_local()
    provider = LocalProvider(context_tokens=64)
    try:
        request = GenerationRequest(model="local", prompt="word " * 200, max_tokens=8)
        with pytest.raises(ContextLengthExceededError):
            async for item in provider.stream(request):
                assert not isinstance(item, Usage)
    finally:
        await provider.aclose()


async def test_a_second_cancel_while_the_thread_stops_still_returns_its_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker cancels a job's task more than once (cancel, then lease lost): the llama.cpp
    context must come back to the pool, or every later local call waits forever."""
    require_local()
    import threading
    import time as clock

    provider = LocalProvider(max_concurrent=1)
    started = threading.Event()

    def slow_generate(model, prompt, request, stops, stop):  # type: ignore[no-untyped-def]
        started.set()
        clock.sleep(0.5)  # a long prompt evaluation: no chance to look at `stop`
        yield "text", "late"

    monkeypatch.setattr(provider, "_load", lambda: object())
    monkeypatch.setattr(provider, "_generate", slow_generate)
    request = GenerationRequest(model="local", prompt="x", max_tokens=4)

    async def consume() -> None:
        async for _ in provider.stream(request):
            pass

    task = asyncio.create_task(consume())
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    await asyncio.sleep(0.05)
    task.cancel()  # the second cancel lands while the first waits for the thread
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.setattr(provider, "_generate", lambda *a: iter([("usage", Usage(1, 0))]))
    items = await asyncio.wait_for(_all(provider.stream(request)), timeout=5)
    assert items == [Usage(1, 0)]


async def _all(stream: Any) -> list[Any]:
    return [item async for item in stream]
