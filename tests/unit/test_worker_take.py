"""A job handed to a worker after its lease ended is not started there."""

from __future__ import annotations

from backburner import Backburner, JobContext
from backburner.worker import Worker
from tests.conformance._support import new_job


async def test_a_job_whose_lease_ended_before_it_arrived_is_not_started() -> None:
    # A worker frozen (SIGSTOP) just after a job was handed to it woke past the job's lease,
    # and ran the job's handler while another worker ran it again.
    bb = Backburner("memory://")
    ran: list[str] = []

    @bb.task
    async def summarize(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    async with bb:
        now = bb.clock.now()
        await bb.backend.enqueue(new_job(now=now - 60, payload={}))
        (late,) = await bb.backend.claim("w1", limit=1, now=now - 60, lease_s=30)
        assert late.lease_expires_at is not None and late.lease_expires_at < now
        worker = Worker(bb, concurrency=2)
        worker._take(late)
        assert worker.running == {}
        await bb.backend.enqueue(new_job(now=now, payload={}))
        (fresh,) = await bb.backend.claim("w1", limit=1, now=now, lease_s=30)
        worker._take(fresh)
        assert list(worker.running) == [(fresh.task_id, fresh.fence)]
        (attempt,) = worker.running.values()
        assert attempt.task is not None
        await attempt.task
    assert ran == [fresh.task_id]
