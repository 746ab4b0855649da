"""Stored jobs that cannot be read back (``CorruptRecordError``): one such record must cost its
own job, never a worker or everybody's listing.

A record may be damaged by hand or by a disk, or written by software that stores what this
release cannot read. A worker that claims one (or finds its lease expired) cannot run it and
could not hand it back usefully: it fails it for good, with error type ``corrupt_record``, and
goes on. The failed job keeps the dead-letter TTL below and then goes like any other. A listing
leaves such a record out (and logs its id); reading it alone raises the error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from ..errors import BackburnerError, CorruptRecordError, LeaseLostError
from ..models import ErrorInfo, Job
from .base import Backend, Fail

log = logging.getLogger("backburner.backend")

UNREADABLE_TTL_S = 7 * 86400.0
"""How long a job failed as unreadable stays in the dead-letter queue (its own TTL is in the
record that cannot be read): ``Settings.dead_letter_ttl_s``'s default."""

_T = TypeVar("_T")


def decode_each(
    documents: Iterable[_T], decode: Callable[[_T], Job]
) -> tuple[list[Job], list[CorruptRecordError]]:
    """Each document decoded on its own: the jobs, and the errors of those that did not."""
    jobs: list[Job] = []
    unreadable: list[CorruptRecordError] = []
    for document in documents:
        try:
            jobs.append(decode(document))
        except CorruptRecordError as exc:
            unreadable.append(exc)
    return jobs, unreadable


def readable(documents: Iterable[_T], decode: Callable[[_T], Job]) -> list[Job]:
    """The jobs of a listing, those that cannot be read left out (and logged)."""
    jobs, unreadable = decode_each(documents, decode)
    for exc in unreadable:
        log.warning("%s; left out of a listing", exc, extra={"task_id": exc.task_id})
    return jobs


async def fail_unreadable(
    backend: Backend,
    exc: CorruptRecordError,
    fence: int | None,
    *,
    now: float,
    expired_only: bool = False,
) -> None:
    """Fail the unreadable job held under ``fence`` for good (``corrupt_record``), as the worker
    that holds it: by a claim of its own, or (``expired_only``: only if its lease has ended at
    ``now``) as a sweeper that found it. Whatever stops that (its id unknown, a lost or renewed
    lease, a failed write) is logged: the lease ends and it comes back."""
    if exc.task_id is None or fence is None:
        log.error("%s; it stays claimed until its lease ends", exc)
        return
    error = ErrorInfo(
        type="corrupt_record",
        message=f"its stored record cannot be read ({exc.reason}); it was not run",
        retryable=False,
    )
    try:
        await backend.finish(
            exc.task_id,
            fence,
            Fail(error, UNREADABLE_TTL_S),
            now=now,
            only_if_lease_expired=expired_only,
        )
    except CorruptRecordError:
        pass  # failed, and still unreadable: the write took effect before the read back
    except LeaseLostError:
        return  # a cancel, another worker's sweeper or a heartbeat got there first
    except BackburnerError as failed:
        log.error("%s; failing it failed too (%s)", exc, failed, extra={"task_id": exc.task_id})
        return
    log.error("%s; failed it (corrupt_record)", exc, extra={"task_id": exc.task_id})
