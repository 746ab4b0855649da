"""``replaced``: the worker's fast ``model_copy(update=...)`` must give what model_copy gives;
``stored_job``: a stored job shares its set of fields and its default progress; ``to_job``: the
producer's unvalidated Job equals the validated one."""

from __future__ import annotations

import dataclasses
import enum

import pydantic
import pytest
from pydantic import BaseModel, ConfigDict

from backburner.backends.base import NewJob
from backburner.errors import InvalidInputError
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


def a_new_job(**changes: object) -> NewJob:
    base = NewJob(
        task_id="task_1",
        type="summarize",
        input={"a": [1]},
        fingerprint="",
        created_at=1.5,
        run_at=2.5,
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {
            "priority": 7,
            "max_attempts": 3,
            "timeout_s": 30.0,
            "deadline_at": 100.5,
            "ttl_s": 60.0,
            "idempotency_key": "acme/k1",
            "metadata": {"m": "v"},
            "webhook_url": "https://example.com/hook",
            "webhook_progress": True,
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tenant": "acme",
            "parent_id": "task_0",
        },
    ],
)
def test_a_new_jobs_job_equals_the_validated_one(changes: dict[str, object]) -> None:
    new = a_new_job(**changes)
    fast = new.to_job()
    slow = Job(
        task_id=new.task_id,
        type=new.type,
        status=JobStatus.QUEUED,
        priority=new.priority,
        input=new.input,
        created_at=new.created_at,
        run_at=new.run_at,
        max_attempts=new.max_attempts,
        metadata=new.metadata,
        webhook_url=new.webhook_url,
        webhook_progress=new.webhook_progress,
        traceparent=new.traceparent,
        tenant=new.tenant,
        parent_id=new.parent_id,
        timeout_s=new.timeout_s,
        deadline_at=new.deadline_at,
        ttl_s=new.ttl_s,
        idempotency_key=new.idempotency_key,
    )
    assert list(fast.__dict__) == list(Job.model_fields)  # every field, none unknown
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert Job.model_validate_json(fast.model_dump_json()) == fast
    assert fast.model_fields_set == set(Job.model_fields)
    with pytest.raises(pydantic.ValidationError):
        fast.status = JobStatus.COMPLETED  # type: ignore[misc]


def test_a_new_jobs_job_takes_the_stored_input_and_shares_no_history() -> None:
    new = a_new_job()
    stored_input, stored_metadata = {"a": [1]}, {"m": 1}
    first, second = new.to_job(input=stored_input, metadata=stored_metadata), new.to_job()
    assert first.input is stored_input and first.metadata is stored_metadata
    assert second.input is new.input
    assert first.history == [] and first.history is not second.history
    assert first.progress is NO_PROGRESS


class Kind(str, enum.Enum):  # noqa: UP042  (the form users write, whose str() is not its value)
    SUMMARIZE = "summarize"


class Level(enum.IntEnum):
    HIGH = 7


class Name(str):
    pass


def test_a_new_jobs_job_has_the_types_validation_gives() -> None:
    """Times given as ints (a clock that counts whole seconds, ``timeout=30``), names as a str
    enum or subclass, counts as an IntEnum: the Job holds what validating them makes."""
    new = a_new_job(
        type=Kind.SUMMARIZE,
        created_at=1_700_000_000,
        run_at=1_700_000_005,
        priority=Level.HIGH,
        max_attempts=Level.HIGH,
        timeout_s=30,
        deadline_at=1_700_000_100,
        ttl_s=60,
        tenant=Name("acme"),
        idempotency_key=Name("acme/k"),
    )
    fast = new.to_job()
    slow = Job.model_validate(
        {**fast.model_dump(), "type": new.type, "created_at": new.created_at}
        | {"run_at": new.run_at, "priority": new.priority, "max_attempts": new.max_attempts}
        | {"timeout_s": new.timeout_s, "deadline_at": new.deadline_at, "ttl_s": new.ttl_s}
        | {"tenant": new.tenant, "idempotency_key": new.idempotency_key}
    )
    assert fast == slow
    assert {k: type(v) for k, v in fast.__dict__.items()} == {
        k: type(v) for k, v in slow.__dict__.items()
    }
    assert fast.type == "summarize" and type(fast.type) is str
    assert fast.timeout_s == 30.0 and type(fast.created_at) is float
    assert type(fast.priority) is int and fast.priority == 7
    assert fast.model_dump() == slow.model_dump()


def test_a_new_job_with_a_name_that_is_not_text_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="expected a string"):
        a_new_job(parent_id=5).to_job()  # type: ignore[arg-type]
