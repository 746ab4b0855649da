"""The Redis backend's outcomes: a finish's script arguments, and the job it leaves made from
them (so a terminal finish need not read the job back)."""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json

from ..jsoncodec import check_usage, encode
from ..models import WEBHOOK_EVENTS, Job, JobStatus, Progress, Usage, replaced
from .base import Complete, Fail, Outcome, Release, RetryAt, Wait
from .redis_codec import number


def webhook_event(outcome: Outcome) -> str:
    """The webhook event of the status an outcome ends in ('' for one that re-queues)."""
    if isinstance(outcome, Complete):
        return WEBHOOK_EVENTS[JobStatus.COMPLETED]
    if isinstance(outcome, Fail):
        return WEBHOOK_EVENTS[JobStatus.FAILED]
    return ""


_DONE = Progress(percent=100.0)
"""A completed job's progress, unless it has a message (a constant: Progress is frozen)."""


def finished_job(
    claimed: Job, outcome: Complete | Fail, details: list[str], now: float, reply: list[Any]
) -> Job:
    """The job as finish.lua leaves it after a Complete or a Fail of the attempt ``claimed``
    (the job as its claim returned it), equal to what read_job would return: made from the
    outcome's script arguments (``details``: kind, result, usage for a Complete) and the reply
    {'ok', false, expires_at, progress percent, progress message}, which carries what may have
    changed since the claim."""
    percent, message = float(reply[3]), None if reply[4] is None else from_json(reply[4])
    progress = claimed.progress
    if progress.percent != percent or progress.message != message:
        # (a Complete sets 100: made once, as Progress is immutable)
        done = percent == 100 and message is None
        progress = _DONE if done else Progress(percent=percent, message=message)
    update: dict[str, Any] = {
        "finished_at": now,
        "expires_at": float(reply[2]),
        "lease_expires_at": None,
        "progress": progress,
    }
    if isinstance(outcome, Complete):
        status, error = JobStatus.COMPLETED, None
        update["result"] = from_json(details[1])
        if details[2]:  # none given leaves the job's usage as it was
            update["usage"] = Usage.model_validate_json(details[2])
    else:
        status, error = JobStatus.FAILED, outcome.error
    update.update(status=status, error=error)
    history = claimed.history
    if history and history[-1].finished_at is None:  # the attempt's record, open since claimed
        closed = {"finished_at": now, "outcome": status.value, "error": error}
        update["history"] = [*history[:-1], replaced(history[-1], closed)]
    return replaced(claimed, update)


def outcome_args(outcome: Outcome, now: float) -> list[str]:
    """finish.lua's arguments for ``outcome`` (its kind first); InvalidInputError for a result,
    usage or error that is not JSON."""
    if isinstance(outcome, Complete):
        result = encode(outcome.result, "result")
        usage = check_usage(outcome.usage)
        return [
            "complete",
            result,
            "" if usage is None else encode(usage, "usage"),
            f'{{"status":"completed","result":{result}}}',
        ]
    if isinstance(outcome, Fail):
        return ["fail", encode(outcome.error.model_dump()), number(outcome.ttl_s)]
    if isinstance(outcome, RetryAt):
        return [
            "retry",
            encode(outcome.error.model_dump()),
            number(outcome.run_at),
            "1" if outcome.run_at > now else "0",
        ]
    if isinstance(outcome, Release):
        reason = encode({"status": "queued", "released": outcome.reason})
        return ["release", reason, _usage_arg(outcome.usage)]
    if isinstance(outcome, Wait):
        reason = encode({"status": "queued", "waiting": outcome.reason})
        return [
            "wait",
            reason,
            number(outcome.run_at),
            "1" if outcome.run_at > now else "0",
            _usage_arg(outcome.usage),
        ]
    raise TypeError(f"unknown outcome {outcome!r}")  # pragma: no cover - a closed union


def _usage_arg(usage: dict[str, Any] | None) -> str:
    """finish.lua's usage argument of a Wait or a Release: '' leaves the job's usage, '{}'
    clears it, else its JSON (Wait.usage)."""
    if usage is None:
        return ""
    return encode(check_usage(usage), "usage")
