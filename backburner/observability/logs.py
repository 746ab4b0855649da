"""Logging: readable lines on a terminal, one JSON object a line elsewhere (for Loki & co).

Log calls that concern a job pass ``extra=job_fields(job)`` (task_id, type, attempt, and an
``event`` name); the JSON formatter lifts those into top-level keys. Prompts and results are
never logged.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from ..models import Job

JOB_FIELDS = ("task_id", "type", "attempt", "event", "tenant", "worker_id", "msg_id")
_READABLE = "%(asctime)s %(levelname)s %(name)s: %(message)s"


STREAK_LOG_EVERY = 100
"""A failure repeated in a row (its backend down) is logged at its first time and every this
many after: the loops that meet it run up to several times a second."""


def worth_logging(failures: int) -> bool:
    """Whether the ``failures``-th failure in a row is logged (STREAK_LOG_EVERY)."""
    return failures == 1 or failures % STREAK_LOG_EVERY == 0


def job_fields(job: Job, event: str) -> dict[str, Any]:
    """The ``extra`` of a log call about ``job``."""
    return {
        "task_id": job.task_id,
        "type": job.type,
        "attempt": job.attempts,
        "event": event,
        "tenant": job.tenant,
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, the job fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """backburner's own handler: the one configure_logging replaces, and nothing else."""


def configure_logging(level: int, *, json_lines: bool | None = None) -> None:
    """Log to stderr: JSON lines unless it is a terminal (or ``json_lines`` says otherwise).

    Only when the root logger has no handler of someone else's (a fresh process, as the CLI
    is): an application or test runner that set up logging keeps its own."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    if root.handlers:
        return
    use_json = not sys.stderr.isatty() if json_lines is None else json_lines
    handler = _Handler()
    handler.setFormatter(JsonFormatter() if use_json else logging.Formatter(_READABLE))
    root.addHandler(handler)
    root.setLevel(level)
    # httpx logs every request's whole URL at INFO: a webhook URL's token, a model server's
    # password. Its warnings still come through.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))
    # A handler's warnings.warn goes through the same handler (one JSON object a line).
    logging.captureWarnings(True)
