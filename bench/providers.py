"""Provider layer benchmarks: the local model's speed, the layer's cost per token, and 10,000
simulated generations at once in one worker process.

    python bench/providers.py [--runs 3] [--only local,overhead,concurrent]

``overhead`` reads one 5,000-token stream from a fake OpenAI server (tests/providers/
fake_openai.py, in its own process) with a bare httpx loop and with OpenAIProvider.
``concurrent`` uses the SQLite backend, or Redis with BENCH_REDIS_URL set.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
from report import summarise  # noqa: E402

from backburner import Backburner, Settings  # noqa: E402
from backburner.builtin import install_builtin_tasks  # noqa: E402
from backburner.providers import GenerationRequest, ModelRouter, Usage  # noqa: E402

SIM_MODELS = {
    "models": {
        "sim": {
            "provider": "simulated",
            "options": {"time_to_first_token_s": 0.5, "tokens_per_s": 10},
        }
    }
}
SIM_TOKENS = 20


# -- the local model ----------------------------------------------------------------------------


async def scenario_local() -> dict[str, float]:
    from backburner.providers.local import LocalProvider

    provider = LocalProvider()
    request = GenerationRequest(
        model="local", prompt="The history of lighthouses begins", max_tokens=128
    )
    try:
        async for _ in provider.stream(  # load the model outside the timing
            GenerationRequest(model="local", prompt="Hi", max_tokens=1)
        ):
            pass
        started = time.perf_counter()
        first = None
        tokens = 0
        async for item in provider.stream(request):
            if isinstance(item, Usage):
                continue
            tokens += 1
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
    finally:
        await provider.aclose()
    assert first is not None and tokens > 1
    return {
        "local_tokens_per_s": (tokens - 1) / (end - first),
        "local_first_token_ms": (first - started) * 1000,
        "local_tokens": tokens,
    }


# -- the layer's own cost per token ---------------------------------------------------------------


async def bare_httpx(base_url: str, tokens: int) -> float:
    import httpx

    body = {
        "model": "ok",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "max_tokens": tokens,
    }
    parts: list[str] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        started = time.perf_counter()
        async with client.stream("POST", "/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    for choice in json.loads(line[5:]).get("choices") or ():
                        if choice["delta"].get("content"):
                            parts.append(choice["delta"]["content"])
        elapsed = time.perf_counter() - started
    assert len(parts) == tokens
    return elapsed


async def through_provider(base_url: str, tokens: int) -> float:
    from backburner.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url)
    request = GenerationRequest(model="ok", prompt="x", max_tokens=tokens)
    parts: list[str] = []
    try:
        started = time.perf_counter()
        async for item in provider.stream(request):
            if isinstance(item, str):
                parts.append(item)
        elapsed = time.perf_counter() - started
    finally:
        await provider.aclose()
    assert len(parts) == tokens
    return elapsed


def scenario_overhead(tokens: int = 5000, rounds: int = 5) -> dict[str, float]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.providers.fake_openai"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        bare, layer = [], []
        for _ in range(rounds):  # alternated, so drift in the machine's load hits both
            bare.append(asyncio.run(bare_httpx(base_url, tokens)))
            layer.append(asyncio.run(through_provider(base_url, tokens)))
    finally:
        server.terminate()
        server.wait(10)
    bare_us, layer_us = min(bare) / tokens * 1e6, min(layer) / tokens * 1e6
    return {
        "bare_httpx_us_per_token": bare_us,
        "provider_us_per_token": layer_us,
        "overhead_us_per_token": layer_us - bare_us,
    }


# -- 10,000 simulated generations in one worker process -------------------------------------------


def make_app(url: str) -> Backburner:
    bb = Backburner(url, settings=Settings(backend_url=url), models=ModelRouter(SIM_MODELS))
    install_builtin_tasks(bb)
    return bb


async def child_worker(url: str, target: int) -> None:
    counter = report.CountCompletions(target)
    bb = make_app(url)
    bb.hooks.hooks.append(counter)
    written = 0
    append_event = bb.backend.append_event

    async def counted(*args: Any, **kwargs: Any) -> int:  # every token and progress event
        nonlocal written
        seq = await append_event(*args, **kwargs)
        written += 1
        return seq

    bb.backend.append_event = counted  # type: ignore[method-assign]
    await bb.connect()
    worker = bb.worker(concurrency=target)
    running = asyncio.create_task(worker.run())
    await worker.started.wait()
    start = time.perf_counter()
    print(json.dumps({"ready": True}), flush=True)
    await counter.reached.wait()
    elapsed = time.perf_counter() - start
    worker.shutdown()
    await running
    await bb.close()
    rss_mb = report.peak_rss_mb()
    result = {"elapsed_s": elapsed, "peak_rss_mb": rss_mb, "events": written}
    print(json.dumps(result), flush=True)


async def scenario_concurrent(url: str, count: int = 10_000) -> dict[str, float]:
    bb = make_app(url)
    await bb.connect()
    payload = {"prompt": "tell me", "model": "sim", "max_tokens": SIM_TOKENS}
    for start in range(0, count, 500):
        await asyncio.gather(
            *[bb.enqueue("generate", payload) for _ in range(min(500, count - start))]
        )
    proc = subprocess.Popen(
        [sys.executable, __file__, "_worker", url, str(count)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    if not json.loads(proc.stdout.readline()).get("ready"):
        raise RuntimeError("worker did not start")
    result = json.loads(proc.stdout.readline())
    proc.wait(60)
    await bb.close()
    wall = result["elapsed_s"]
    return {
        "concurrent_wall_s": wall,
        "concurrent_ideal_s": 0.5 + (SIM_TOKENS - 1) / 10,  # first token, then 10 tokens/s
        "concurrent_peak_rss_mb": result["peak_rss_mb"],
        "concurrent_events_written": result["events"],
        "concurrent_events_per_s": result["events"] / wall,
        "concurrent_tokens_per_s": count * SIM_TOKENS / wall,
    }


def run_one(name: str) -> dict[str, Any]:
    if name == "local":
        return asyncio.run(scenario_local())
    if name == "overhead":
        return scenario_overhead()
    with report.backend_url("providers") as url:
        return asyncio.run(scenario_concurrent(url))


def run_all(names: list[str], runs: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {}
    for name in names:
        for _ in range(runs):
            for key, value in run_one(name).items():
                samples.setdefault(key, []).append(value)
    return summarise(samples)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        asyncio.run(child_worker(sys.argv[2], int(sys.argv[3])))
    else:
        report.main(
            __doc__.splitlines()[0],
            ["local", "overhead", "concurrent"],
            ROOT / "bench" / "results" / "providers.json",
            run_all,
        )
