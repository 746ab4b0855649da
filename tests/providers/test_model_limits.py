"""A model's max_concurrent holds across worker processes (real ``backburner worker``s)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backburner import Backburner, JobStatus, Settings
from backburner.backends.redis import RedisBackend
from backburner.builtin import install_builtin_tasks
from backburner.providers import ModelRouter

from ..conftest import REDIS_TEST_URL, drop_redis_keys, require_redis
from .fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]


@pytest.fixture(params=["sqlite", "redis"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    require_redis()
    prefix = "test-" + uuid.uuid4().hex[:12]
    yield f"{REDIS_TEST_URL}?prefix={prefix}"
    await drop_redis_keys(RedisBackend(REDIS_TEST_URL, prefix=prefix))


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    stop(procs)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def test_max_concurrent_is_never_exceeded_by_three_worker_processes(
    fake: FakeOpenAI,
    db_url: str,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    upstream = f"limited.{uuid.uuid4().hex[:8]}"  # 0.05 s a token
    config = {
        "models": {
            "capped": {
                "provider": "openai",
                "base_url": fake.base_url,
                "upstream": upstream,
                "max_concurrent": 2,
            }
        }
    }
    models_file = tmp_path / "models.json"
    models_file.write_text(json.dumps(config))
    env = {
        **os.environ,
        "BACKBURNER_BACKEND_URL": db_url,
        "BACKBURNER_MODELS": str(models_file),
        "BACKBURNER_LEASE_S": "5",
        "BACKBURNER_HEARTBEAT_S": "1",
    }
    for i in range(3):
        with (tmp_path / f"worker-{i}.log").open("wb") as log:  # the child keeps its own copy
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "backburner", "worker", "--concurrency", "5"],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    bb = Backburner(
        settings=Settings(backend_url=db_url), models=ModelRouter.from_source(str(models_file))
    )
    install_builtin_tasks(bb)
    async with bb:
        jobs = [
            await bb.enqueue("generate", {"prompt": f"p{i}", "model": "capped", "max_tokens": 6})
            for i in range(12)
        ]
        done = await asyncio.gather(*(bb.wait(j.task_id, timeout=60) for j in jobs))
        owners = {a.worker_id for j in done for a in (await bb.get(j.task_id)).history}
    assert [j.status for j in done] == [JobStatus.COMPLETED] * 12, [j.error for j in done]
    assert len(fake.state.calls_of(upstream)) == 12
    assert fake.state.max_open_streams[upstream] == 2  # the cap, reached and never passed
    assert len(owners) >= 2, "the jobs should have been spread over the worker processes"
