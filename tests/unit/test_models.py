"""``replaced``: the worker's fast ``model_copy(update=...)`` must give what model_copy gives;
``stored_job``: a stored job shares its set of fields and its default progress."""

from __future__ import annotations

import pydantic
import pytest
from pydantic import BaseModel, ConfigDict

from backburner.models import (
    NO_PROGRESS,
    AttemptRecord,
    ErrorInfo,
    Job,
    JobStatus,
    Progress,
    replaced,
    stored_job,
)


def a_job() -> Job:
    return Job(
        task_id="t_1",
        type="summarize",
        status=JobStatus.PROCESSING,
        created_at=1.0,
        run_at=1.0,
        started_at=2.0,
        attempts=1,
        fence=1,
        worker_id="w1",
        history=[AttemptRecord(attempt=1, worker_id="w1", started_at=2.0)],
    )


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"status": JobStatus.COMPLETED, "finished_at": 3.0, "result": {"a": [1]}},
        {"progress": Progress(percent=50, message="half"), "lease_expires_at": None},
    ],
)
def test_a_job_replaced_equals_its_model_copy(update: dict[str, object]) -> None:
    job = a_job()
    fast, slow = replaced(job, update), job.model_copy(update=update)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump_json(exclude_unset=True) == slow.model_dump_json(exclude_unset=True)
    assert job.status == JobStatus.PROCESSING and job.finished_at is None  # the original stays


def test_a_replaced_record_is_still_frozen_and_shares_nothing_mutable_with_its_original() -> None:
    record = a_job().history[0]
    error = ErrorInfo(type="boom", message="no")
    closed = replaced(record, {"finished_at": 3.0, "outcome": "failed", "error": error})
    assert closed == record.model_copy(
        update={"finished_at": 3.0, "outcome": "failed", "error": error}
    )
    with pytest.raises(pydantic.ValidationError):
        closed.outcome = "completed"  # type: ignore[misc]
    assert closed.__dict__ is not record.__dict__ and record.outcome is None


def test_a_model_with_extra_members_takes_model_copy() -> None:
    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")
        a: int = 0

    loose = Loose(a=1, b=2)  # type: ignore[call-arg]
    copied = replaced(loose, {"a": 3})
    assert copied.a == 3 and copied.model_extra == {"b": 2}
    assert copied.model_extra is not loose.model_extra


def test_stored_jobs_share_one_set_of_fields_which_no_copy_changes() -> None:
    job = a_job()
    first = stored_job(job.model_dump_json())
    second = stored_job(job.model_dump_json(exclude={"history", "progress", "worker_id"}))
    assert first == job
    assert first.model_fields_set == set(Job.model_fields)
    assert first.model_fields_set is second.model_fields_set
    assert first.history[0].model_fields_set == set(AttemptRecord.model_fields)
    shared = set(first.model_fields_set)
    copied = first.model_copy(update={"status": JobStatus.COMPLETED})
    fast = replaced(first, {"status": JobStatus.COMPLETED, "finished_at": 3.0})
    assert copied.status == fast.status == JobStatus.COMPLETED
    assert first.model_fields_set == shared and first.status == JobStatus.PROCESSING
    assert fast.model_fields_set == shared and copied.model_fields_set == shared


def test_a_stored_job_without_progress_shares_the_default() -> None:
    job = stored_job(a_job().model_dump_json(exclude={"progress"}))
    assert job.progress is NO_PROGRESS
    assert job.progress == Progress() and job.model_dump()["progress"] == Progress().model_dump()
    assert stored_job(a_job().model_dump_json()).progress == Progress()
