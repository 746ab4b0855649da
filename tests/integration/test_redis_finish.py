"""The Redis backend's finish given the claimed job: a terminal outcome is not read back."""

from __future__ import annotations

from typing import Any

import pytest

from backburner.backends import redis as redis_backend
from backburner.backends.base import Complete, Fail, Outcome, RetryAt
from backburner.backends.redis import RedisBackend
from backburner.models import Job, Progress

from ..conformance._support import T0, claim_one, enqueue, error


@pytest.fixture
def read_back(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The documents finish decoded (a job it read back rather than built)."""
    decoded: list[bytes] = []

    def spy(document: bytes) -> Job:
        decoded.append(document)
        return Job.model_validate_json(document)

    monkeypatch.setattr(redis_backend, "decode_job", spy)
    return decoded


async def running(engine: RedisBackend) -> Job:
    job = await enqueue(engine, metadata={"k": [1]}, webhook_url="https://example.com/h")
    claimed = await claim_one(engine, job.task_id, now=T0 + 1)
    progress = Progress(percent=30.0, message="a third")
    await engine.append_event(job.task_id, claimed.fence, "p", None, now=T0 + 2, progress=progress)
    return claimed


@pytest.mark.parametrize(
    "outcome",
    [Complete({"a": 1}, usage={"input_tokens": 2}), Fail(error(), ttl_s=60.0)],
    ids=["complete", "fail"],
)
async def test_a_terminal_outcome_of_the_claimed_job_is_built_not_read(
    engine: RedisBackend, read_back: list[bytes], outcome: Outcome
) -> None:
    claimed = await running(engine)
    read_back.clear()  # (what the claim decoded: not finish's)
    done = await engine.finish(claimed.task_id, claimed.fence, outcome, now=T0 + 3, claimed=claimed)
    assert read_back == []
    assert done == await engine.get(claimed.task_id)
    assert done.progress.message == "a third"


async def test_a_completed_job_without_progress_of_its_own_is_built_at_100_percent(
    engine: RedisBackend, read_back: list[bytes]
) -> None:
    job = await enqueue(engine)
    claimed = await claim_one(engine, job.task_id, now=T0 + 1)
    assert claimed.progress == Progress()
    read_back.clear()  # (what the claim decoded: not finish's)
    done = await engine.finish(
        job.task_id, claimed.fence, Complete(None), now=T0 + 2, claimed=claimed
    )
    assert read_back == []
    assert done == await engine.get(job.task_id)
    assert done.progress == Progress(percent=100.0)


@pytest.mark.parametrize(
    ("outcome", "claimed_as"),
    [
        (Complete(1), None),
        (RetryAt(error(), run_at=T0 + 9), "claimed"),
        (Complete(1), "other fence"),
    ],
    ids=["no-claimed", "retry", "other-fence"],
)
async def test_anything_else_is_read_back(
    engine: RedisBackend, read_back: list[bytes], outcome: Outcome, claimed_as: str | None
) -> None:
    claimed = await running(engine)
    read_back.clear()  # (what the claim decoded: not finish's)
    given: dict[str, Any] = {}
    if claimed_as == "claimed":
        given["claimed"] = claimed
    elif claimed_as == "other fence":
        given["claimed"] = claimed.model_copy(update={"fence": claimed.fence + 1})
    done = await engine.finish(claimed.task_id, claimed.fence, outcome, now=T0 + 3, **given)
    assert len(read_back) == 1
    assert done == await engine.get(claimed.task_id)
