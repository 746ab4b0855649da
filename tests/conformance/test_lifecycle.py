"""connect/close are idempotent; a second connection sees the same store."""

from __future__ import annotations

from pathlib import Path

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete
from backburner.models import JobStatus

from ._support import T0, claim_one, drive, enqueue, new_job, opened, peer


async def test_connect_is_idempotent(backend: Backend) -> None:
    job = await enqueue(backend)
    await backend.connect()
    await backend.connect()
    stored = await backend.get(job.task_id)
    assert stored is not None and stored.status == JobStatus.QUEUED
    await enqueue(backend)
    assert len((await backend.list_jobs()).jobs) == 2


async def test_close_is_idempotent(backend_kind: str, tmp_path: Path) -> None:
    async with opened(backend_kind, tmp_path / "closing") as engine:
        job = await enqueue(engine)
        assert await engine.get(job.task_id) is not None
        await engine.close()
        await engine.close()
    # opened() closes it a third time on the way out, without error.


async def test_a_second_connection_sees_every_write(backend: Backend) -> None:
    async with peer(backend) as other:
        job = await enqueue(backend, payload={"q": 1}, idempotency_key="k")
        seen = await other.get(job.task_id)
        assert seen is not None and seen.model_dump() == job.model_dump()
        claimed = await claim_one(other, job.task_id, worker="w2", now=T0)
        await other.append_event(job.task_id, claimed.fence, "log", "from the peer", now=T0 + 1)
        await backend.finish(job.task_id, claimed.fence, Complete(result=7), now=T0 + 2)
        final = await other.get(job.task_id)
        assert final is not None and final.status == JobStatus.COMPLETED and final.result == 7
        assert [e.seq for e in await other.events(job.task_id)] == [1, 2, 3, 4]
        # The idempotency key is shared too.
        existing, created = await other.enqueue(new_job(payload={"q": 1}, idempotency_key="k"))
        assert created is False and existing.task_id == job.task_id


@pytest.mark.parametrize("status", list(JobStatus))
async def test_job_status_reads_the_status_alone(backend: Backend, status: JobStatus) -> None:
    job = await drive(backend, status)
    assert await backend.job_status(job.task_id) == status
    assert await backend.job_status("task_" + "0" * 32) is None
