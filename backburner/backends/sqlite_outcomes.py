"""How each attempt outcome becomes one guarded UPDATE of the jobs table, plus its events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..jsoncodec import check_usage, encode
from .base import Complete, Fail, Outcome, Release, RetryAt, Wait
from .sqlite_schema import valid_json

_ERROR_TOO = ", '$[#-1].error', json(:error)"


def _close_history(more: str = "") -> str:
    """Close the attempt in progress (the last record of history), with ``more`` paths and
    values to set. A history that is not JSON is left as it is (an unreadable job is failed
    all the same: unreadable.py)."""
    closed = f"json_set(history, '$[#-1].finished_at', :now, '$[#-1].outcome', :outcome{more})"
    return f"history = iif({valid_json('history')}, {closed}, history)"


class EncodedJSON(str):
    """Event data already encoded as JSON (saves encoding a large result twice)."""


@dataclass(frozen=True, slots=True)
class OutcomeUpdate:
    """The SET clause and parameters for one outcome, and the events it appends, in order."""

    sets: str
    params: dict[str, Any]
    events: list[tuple[str, Any]]


def outcome_update(outcome: Outcome) -> OutcomeUpdate:
    """Build the update; InvalidInputError if the result or usage cannot be stored."""
    if isinstance(outcome, Complete):
        result = encode(outcome.result, "result")
        usage = check_usage(outcome.usage)
        return OutcomeUpdate(
            "status = 'completed', result = :result, usage = COALESCE(:usage, usage),"
            " error = NULL, finished_at = :now, expires_at = :now + ttl_s,"
            " lease_expires_at = NULL, progress_percent = 100, event_seq = event_seq + 1,"
            f" {_close_history()}",
            {
                "outcome": "completed",
                "result": result,
                "usage": None if usage is None else encode(usage, "usage"),
            },
            [("status", EncodedJSON(f'{{"status":"completed","result":{result}}}'))],
        )
    if isinstance(outcome, Fail):
        error = outcome.error.model_dump()
        return OutcomeUpdate(
            "status = 'failed', error = :error, finished_at = :now,"
            " expires_at = :now + :fail_ttl, lease_expires_at = NULL, event_seq = event_seq + 2,"
            f" {_close_history(_ERROR_TOO)}",
            {"outcome": "failed", "error": encode(error), "fail_ttl": outcome.ttl_s},
            [
                ("attempt_failed", {"error": error}),
                ("status", {"status": "failed", "error": error}),
            ],
        )
    if isinstance(outcome, RetryAt):
        error = outcome.error.model_dump()
        return OutcomeUpdate(
            "status = 'queued', error = :error, run_at = :run_at, worker_id = NULL,"
            " lease_expires_at = NULL, event_seq = event_seq + 2,"
            f" {_close_history(_ERROR_TOO)}",
            {"outcome": "retry", "error": encode(error), "run_at": outcome.run_at},
            [
                ("attempt_failed", {"error": error, "retry_at": outcome.run_at}),
                ("status", {"status": "queued"}),
            ],
        )
    if isinstance(outcome, Release):
        usage_set, usage_text = _usage_update(outcome.usage)
        return OutcomeUpdate(
            "status = 'queued', attempts = attempts - 1, run_at = :now, worker_id = NULL,"
            f" lease_expires_at = NULL,{usage_set} event_seq = event_seq + 1, {_close_history()}",
            {"outcome": "released", "usage": usage_text},
            [("status", {"status": "queued", "released": outcome.reason})],
        )
    if isinstance(outcome, Wait):
        # Like a Release, but due at run_at (finish also takes the job out of its tenant's
        # line until then); encoded here, so a reason that is not JSON is refused up front.
        waiting = encode({"status": "queued", "waiting": outcome.reason})
        usage_set, usage_text = _usage_update(outcome.usage)
        return OutcomeUpdate(
            "status = 'queued', attempts = attempts - 1, run_at = :run_at, worker_id = NULL,"
            f" lease_expires_at = NULL,{usage_set} event_seq = event_seq + 1, {_close_history()}",
            {"outcome": "waiting", "run_at": outcome.run_at, "usage": usage_text},
            [("status", EncodedJSON(waiting))],
        )
    raise TypeError(f"unknown outcome {outcome!r}")  # pragma: no cover - a closed union


def _usage_update(usage: dict[str, Any] | None) -> tuple[str, str | None]:
    """A Wait's or a Release's usage: the SET clause (none when it is left as it is) and its
    value (NULL for {}: cleared). See Wait.usage."""
    if usage is None:
        return "", None
    checked = check_usage(usage)
    return " usage = :usage,", encode(checked, "usage") if checked else None
