"""A worker SIGKILLed while it delivers a webhook: another worker delivers it, same message id."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backburner import Backburner, Settings
from backburner.builtin import install_builtin_tasks
from backburner.models import WebhookStatus

from ..helpers import WorkerProcesses, eventually
from .conftest import SECRET
from .receiver import Answer, Receiver

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]
Spawn = Callable[[], subprocess.Popen[bytes]]


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Spawn]:
    workers = WorkerProcesses(tmp_path)

    def start() -> subprocess.Popen[bytes]:
        env = {
            "BACKBURNER_BACKEND_URL": db_url,
            "BACKBURNER_WEBHOOK_SECRET": SECRET,
            "BACKBURNER_WEBHOOK_ALLOW_HOSTS": "127.0.0.0/8",
            "BACKBURNER_WEBHOOK_TIMEOUT_S": "1",  # a claimed message's lease: 7 s
            "BACKBURNER_WEBHOOK_RETRY_SCHEDULE": "0,0.2,0.2,0.2,0.2",
            "BACKBURNER_SWEEP_INTERVAL_S": "0.2",
        }
        return workers.start("--concurrency", "4", env=env)

    yield start
    workers.stop()


async def test_a_worker_killed_mid_delivery_does_not_lose_the_webhook(
    hooks: Receiver, db_url: str, spawn: Spawn
) -> None:
    hang = threading.Event()
    hooks.state.plan("/crash", Answer(204, hold=hang))  # the first request never answers
    victim = spawn()
    bb = Backburner(settings=Settings(backend_url=db_url, webhook_allow_hosts="127.0.0.0/8"))
    install_builtin_tasks(bb)
    async with bb:
        job = await bb.enqueue(
            "generate",
            {"prompt": "hi", "model": "simulated", "max_tokens": 2},
            webhook_url=hooks.url("/crash"),
        )
        await asyncio.to_thread(hooks.state.wait_for, "/crash", 1)  # completed; delivering
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        spawn()
        first, second = await asyncio.to_thread(hooks.state.wait_for, "/crash", 2, 30)

        async def delivered() -> bool:
            messages = await bb.webhooks(job.task_id)
            return messages[0].status is WebhookStatus.DELIVERED

        await eventually(delivered, timeout=30, message="delivered by the second worker")
        messages = await bb.webhooks(job.task_id)
    hang.set()
    assert len(messages) == 1  # exactly one message for the job
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == messages[0].msg_id
    assert first.body == second.body
    # The dead worker's lease on the message (2 x timeout + 1 s) ended before the retry.
    assert second.at - first.at >= 2.5
