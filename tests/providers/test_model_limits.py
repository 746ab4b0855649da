"""A model's max_concurrent holds across worker processes (real ``backburner worker``s), and a
killed worker's slot comes back when its lease ends."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backburner import Backburner, JobStatus, Settings
from backburner.builtin import install_builtin_tasks
from backburner.providers import ModelRouter
from backburner.providers.slots import slot_key

from ..helpers import WorkerProcesses, eventually
from .fake_openai import FakeOpenAI

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]
LEASE_S = 2.0

Spawn = Callable[..., subprocess.Popen[bytes]]


def capped_models(fake: FakeOpenAI, upstream: str, limit: int, tmp_path: Path) -> Path:
    route = {"provider": "openai", "base_url": fake.base_url, "upstream": upstream}
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": {"capped": {**route, "max_concurrent": limit}}}))
    return path


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Spawn]:
    workers = WorkerProcesses(tmp_path)

    def start(concurrency: int = 5) -> subprocess.Popen[bytes]:
        env = {
            "BACKBURNER_BACKEND_URL": db_url,
            "BACKBURNER_MODELS": str(tmp_path / "models.json"),
            "BACKBURNER_LEASE_S": str(LEASE_S),
            "BACKBURNER_HEARTBEAT_S": "0.5",
            "BACKBURNER_SWEEP_INTERVAL_S": "0.2",
        }
        return workers.start("--concurrency", str(concurrency), env=env)

    yield start
    workers.stop(graceful=True)


def client(db_url: str, models: Path) -> Backburner:
    bb = Backburner(
        settings=Settings(backend_url=db_url), models=ModelRouter.from_source(str(models))
    )
    install_builtin_tasks(bb)
    return bb


async def test_max_concurrent_is_never_exceeded_by_three_worker_processes(
    fake: FakeOpenAI, db_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    upstream = f"limited.{uuid.uuid4().hex[:8]}"  # 0.05 s a token
    models = capped_models(fake, upstream, 2, tmp_path)
    for _ in range(3):
        spawn()
    async with client(db_url, models) as bb:
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


async def test_the_slot_of_a_killed_worker_comes_back_when_its_lease_ends(
    fake: FakeOpenAI, db_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    slow = f"slow.{uuid.uuid4().hex[:8]}"  # 0.2 s a token: 200 tokens outlast the test
    models = capped_models(fake, slow, 1, tmp_path)
    victim = spawn(concurrency=1)
    async with client(db_url, models) as bb:
        first = await bb.enqueue(
            "generate", {"prompt": "a", "model": "capped", "max_tokens": 200}, max_attempts=1
        )
        await eventually(lambda: len(fake.state.calls_of(slow)) == 1, message="first call")
        spawn()  # the victim runs one job at a time: the second goes to this worker
        second = await bb.enqueue(
            "generate", {"prompt": "b", "model": "capped", "max_tokens": 2}, max_attempts=1
        )

        async def waiting() -> bool:
            return (await bb.get(second.task_id)).status is JobStatus.PROCESSING

        await eventually(waiting, message="the second job claimed, waiting for the slot")
        assert len(fake.state.calls_of(slow)) == 1  # held back by the limit of 1
        assert await bb.backend.slots_in_use(slot_key("capped"), now=time.time()) == 1
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed_at = time.monotonic()
        done = await bb.wait(second.task_id, timeout=30)
    assert done.status is JobStatus.COMPLETED, done.error
    second_call = fake.state.calls_of(slow)[1]
    # The victim renewed its slot every 0.5 s, so the lease ran out 1.5..2 s after the kill.
    waited = second_call.started - killed_at
    assert LEASE_S - 0.5 - 0.2 <= waited < LEASE_S + 5, waited
    assert first.task_id != second.task_id
