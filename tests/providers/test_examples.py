"""examples/: the routing files load, and the ctx.llm task runs against an OpenAI-style server."""

from __future__ import annotations

from pathlib import Path

import pytest

from backburner import Backburner, JobStatus
from backburner.providers import ModelRouter

from ..helpers import WORKER_TEST_SETTINGS, running_worker
from .fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["models-openai.toml", "models-local-servers.toml"])
def test_the_example_routing_files_load(name: str) -> None:
    router = ModelRouter.from_source(str(ROOT / "examples" / name))
    chain = router.chain(None)
    assert len(chain) == 2 and all(r.max_concurrent for r in chain[:1])
    if name == "models-openai.toml":
        assert chain[0].api_key_env == "OPENAI_API_KEY" and chain[0].input_usd_per_mtok
    else:
        assert chain[0].base_url == "http://127.0.0.1:11434/v1"
        assert router.route("qwen").upstream == "Qwen/Qwen2.5-1.5B-Instruct"


async def test_the_llm_task_example_makes_two_calls_and_sums_their_usage(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    from examples import llm_task

    models = {
        "default_model": "m",
        "models": {
            "m": {
                "provider": "openai",
                "base_url": fake.base_url,
                "upstream": "ok",
                "output_usd_per_mtok": 1.0,
            }
        },
    }
    settings = WORKER_TEST_SETTINGS.replace(backend_url=f"sqlite:///{tmp_path / 'jobs.db'}")
    bb = Backburner(settings=settings, models=ModelRouter(models))
    bb.tasks.update(llm_task.bb.tasks)
    async with bb, running_worker(bb):
        job = await bb.enqueue("answer_twice", {"question": "What is a lease?"})
        done = await bb.wait(job.task_id, timeout=30)
    assert done.status is JobStatus.COMPLETED, done.error
    assert done.result is not None and done.result["model"] == "m"
    assert done.result["answer"].startswith("alpha beta gamma delta")
    usage = done.usage.model_dump() if done.usage else {}
    assert usage["calls"] == 2
    assert usage["output_tokens"] == 200 + 60 and usage["input_tokens"] == 14
    assert usage["cost_usd"] == pytest.approx(260 / 1e6)
