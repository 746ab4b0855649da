"""A pipeline survives its worker's SIGKILL in the middle of a step: it completes on another
worker, and the steps that had completed do not run again (real processes, SQLite and Redis)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from backburner import Backburner, Settings
from backburner.models import JobStatus

from ..helpers import WorkerProcesses, eventually

pytestmark = pytest.mark.slow

FAST = {
    "BACKBURNER_LEASE_S": "2.0",
    "BACKBURNER_HEARTBEAT_S": "0.5",
    "BACKBURNER_SWEEP_INTERVAL_S": "0.2",
    "BACKBURNER_CANCEL_POLL_S": "0.1",
}


def steps_run(marker_dir: Path) -> Counter[str]:
    path = marker_dir / "steps"
    return Counter(path.read_text().split()) if path.exists() else Counter()


async def test_sigkill_in_step_three_of_four_resumes_without_rerunning_steps_one_and_two(
    db_url: str, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    bb = Backburner(db_url, settings=Settings(backend_url=db_url))
    from tests import workerapp

    bb.tasks.update(workerapp.bb.tasks)
    workers = WorkerProcesses(tmp_path)
    env = {"BACKBURNER_BACKEND_URL": db_url, **FAST}
    try:
        async with bb:
            job = await bb.enqueue("four_steps", {"marker_dir": str(markers)})
            first = workers.start("tests.workerapp:bb", env=env)
            await eventually(
                lambda: steps_run(markers)["three"] == 1, timeout=60, message="step 3 started"
            )
            first.send_signal(signal.SIGKILL)
            first.wait(15)
            (markers / "release").touch()
            workers.start("tests.workerapp:bb", env=env)
            done = await bb.wait(job.task_id, timeout=60)
    finally:
        workers.stop()
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result is not None and done.result["steps"] == ["one", "two", "three", "four"]
    assert steps_run(markers) == Counter(one=1, two=1, three=2, four=1)
    assert done.attempts == 2
