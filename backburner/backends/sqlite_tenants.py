"""Tenants on SQLite: the limits ``enqueue`` checks and the fair-share tags that order ``claim``.

State (tables in sqlite_schema.py): ``tenant_lines`` (per tenant, task type and priority: jobs
queued or processing and the last fair-share tag, kept by triggers on ``jobs``),
``fair_clocks`` (the virtual clock of each ready queue, a task type and priority; start-time
fair queueing, see ``Backend.claim``), ``tenant_rates``
(each submission bucket's theoretical arrival time), and the ``fair_tag`` column of a queued
job (NULL: not in its tenant's line yet). The functions here run
inside an operation of the backend's writer, so inside its ``BEGIN IMMEDIATE`` transaction: a
count, a check and the insert it allows see no other writer in between, in any process.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from ..errors import QuotaExceededError
from .admission import RATE_WINDOW_S, check_quota
from .base import NewJob, Quota
from .sqlite_executor import SQLiteExecutor


def fair_tag(tenant: str, type: str, priority: str, cost: str) -> str:
    """The SQL expression of the tag of a job joining its tenant's line now, given the SQL of
    its tenant, type, priority and fair_cost: ``max(the tenant's last tag in that queue, the
    queue's clock) + cost``; a queue with no clock yet starts from the largest clock at that
    priority (so a new type does not go ahead of every other). Writing it into
    ``jobs.fair_tag`` makes it the tenant's last tag (triggers ``jobs_line_insert``,
    ``jobs_line_tag``), so the next tag starts from it."""
    return (
        "max(coalesce((SELECT last_tag FROM tenant_lines WHERE tenant_lines.tenant ="
        f" {tenant} AND tenant_lines.type = {type} AND tenant_lines.priority = {priority}),"
        f" 0), coalesce((SELECT clock FROM fair_clocks WHERE fair_clocks.type = {type} AND"
        f" fair_clocks.priority = {priority}), (SELECT max(clock) FROM fair_clocks WHERE"
        f" fair_clocks.priority = {priority}), 0)) + {cost}"
    )


_LEVEL = (
    " ON CONFLICT (type, priority) DO UPDATE SET clock = excluded.clock"
    " WHERE clock < excluded.clock AND NOT EXISTS (SELECT 1 FROM jobs INDEXED BY jobs_waiting"
    " WHERE jobs.type = excluded.type AND jobs.priority = excluded.priority"
    " AND status = 'queued' AND fair_tag IS NOT NULL)"
)
_OPEN_CLOCK = (
    "INSERT INTO fair_clocks (type, priority, clock)"
    " SELECT ?1, ?2, coalesce(max(clock), 0) FROM fair_clocks WHERE priority = ?2" + _LEVEL
)
"""Before a job joins a queue (a type at a priority): give the queue its clock, the largest at
its priority, if it has none yet or no job waits in it; else claims from it alone move it.
A clock that stood still while the others moved on (no job of its type came) would put the
queue's next backlog ahead of every job of the others, for a worker serving several types."""

_OPEN_CLOCK_OF_JOB = (
    "INSERT INTO fair_clocks (type, priority, clock)"
    " SELECT type, priority, (SELECT coalesce(max(clock), 0) FROM fair_clocks"
    " WHERE fair_clocks.priority = jobs.priority) FROM jobs WHERE task_id = ?" + _LEVEL
)


def open_clock(conn: sqlite3.Connection, type: str, priority: int) -> None:
    conn.execute(_OPEN_CLOCK, (type, priority))


def open_clock_of(conn: sqlite3.Connection, task_id: str) -> None:
    """``open_clock`` for the queue of the job ``task_id`` (about to join it again)."""
    conn.execute(_OPEN_CLOCK_OF_JOB, (task_id,))


_IN_FLIGHT = "SELECT coalesce(sum(in_flight), 0) FROM tenant_lines WHERE tenant = ?"


ROW_TAG = fair_tag("jobs.tenant", "jobs.type", "jobs.priority", "jobs.fair_cost")
"""The tag of the job an UPDATE of ``jobs`` is at, joining its tenant's line now."""


def admit(conn: sqlite3.Connection, job: NewJob, quota: Quota | None) -> None:
    """Raise the limit error ``quota`` calls for (see ``check_quota``), else take the job's
    token from its tenant's bucket (rolled back with the operation if the insert fails)."""
    if quota is None:
        return
    in_flight = 0
    if quota.max_in_flight is not None:
        (in_flight,) = conn.execute(_IN_FLIGHT, (job.tenant,)).fetchone()
    tat = None
    if quota.per_minute is not None:
        found = conn.execute("SELECT tat FROM tenant_rates WHERE tenant = ?", (job.tenant,))
        tat = found.fetchone()
    new_tat = check_quota(
        job, quota, in_flight=in_flight, tat=None if tat is None else tat[0], now=job.created_at
    )
    if new_tat is not None:
        conn.execute(
            "INSERT INTO tenant_rates (tenant, tat) VALUES (?, ?)"
            " ON CONFLICT (tenant) DO UPDATE SET tat = excluded.tat",
            (job.tenant, new_tat),
        )


def check_in_flight(conn: sqlite3.Connection, tenant: str, quota: Quota | None) -> None:
    """QuotaExceededError if the tenant has ``quota.max_in_flight`` jobs queued or processing
    (for a job coming back into flight, a replay)."""
    if quota is None or quota.max_in_flight is None:
        return
    (in_flight,) = conn.execute(_IN_FLIGHT, (tenant,)).fetchone()
    if in_flight >= quota.max_in_flight:
        raise QuotaExceededError(tenant, quota.max_in_flight)


def join_due(conn: sqlite3.Connection, now: float) -> None:
    """Give the queued jobs that became due since they were queued their tags, in (run_at,
    enqueue order). One index probe when there are none."""
    rows = conn.execute(
        "SELECT seq, type, priority FROM jobs INDEXED BY jobs_untagged"
        " WHERE status = 'queued' AND fair_tag IS NULL AND run_at <= ? ORDER BY run_at, seq",
        (now,),
    ).fetchall()
    if rows:  # one at a time, in order: each tag moves the last tag the next one starts from
        conn.executemany(_OPEN_CLOCK, {(r[1], r[2]) for r in rows})
        conn.executemany(
            f"UPDATE jobs SET fair_tag = {ROW_TAG} WHERE seq = ?", [(r[0],) for r in rows]
        )


def advance_clocks(conn: sqlite3.Connection, claimed: Iterable[tuple[str, int, int]]) -> None:
    """Move each queue's clock up to the largest tag claimed from it: (type, priority, tag)."""
    top: dict[tuple[str, int], int] = {}
    for type, priority, tag in claimed:
        top[type, priority] = max(tag, top.get((type, priority), tag))
    conn.executemany(
        "INSERT INTO fair_clocks (type, priority, clock) VALUES (?, ?, ?)"
        " ON CONFLICT (type, priority) DO UPDATE SET clock = max(clock, excluded.clock)",
        [(type, priority, tag) for (type, priority), tag in top.items()],
    )


def purge_tenant_state(conn: sqlite3.Connection, now: float) -> None:
    """Drop rows that say no more than their absence would (the sweeper's housekeeping, for
    tenants that went away): a line with no jobs in flight whose last tag the clock passed (the
    clock decides the next tag; the triggers insert the row again), and a bucket that has been
    full for a minute (a submitter whose clock lags less than that sees no difference)."""
    conn.execute(
        "DELETE FROM tenant_lines WHERE in_flight = 0 AND last_tag <= coalesce((SELECT clock"
        " FROM fair_clocks WHERE fair_clocks.type = tenant_lines.type"
        " AND fair_clocks.priority = tenant_lines.priority), 0)"
    )
    conn.execute("DELETE FROM tenant_rates WHERE tat <= ?", (now - RATE_WINDOW_S,))


class SQLiteTenants:
    """The tenant reads of the ``Backend`` contract (see base.py) for ``SQLiteBackend``."""

    _executor: SQLiteExecutor

    async def tenant_in_flight(self, tenant: str) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return int(conn.execute(_IN_FLIGHT, (tenant,)).fetchone()[0])

        return await self._executor.run(op, write=False)
