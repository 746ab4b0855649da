"""Pipelines on SQLite: a job's children, and the parked parent that waits for them to end.

``SQLiteChildren`` is mixed into ``SQLiteBackend``. A child carries its parent's id in
``jobs.parent_id`` (written by ``enqueue``, never changed). Two partial indexes hold children
only (sqlite_schema.py), so the many jobs that are nobody's child cost them nothing:
``jobs_children`` (parent_id, seq) serves a parent's listing, newest first, and
``jobs_children_status`` (parent_id, status, seq) its open children and a listing by status.
The listing lives here because the parent filter decides its index.

A parent parks by finishing an attempt with ``Wait``: a queued job not due yet, out of its
tenant's fair-share line. ``wake`` makes it due now; its commit wakes ``wait_for_jobs`` in every
process (see sqlite_wait.py).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..models import JobStatus
from .base import Page, parse_cursor
from .sqlite_executor import SQLiteExecutor
from .sqlite_schema import COLUMNS, row_to_job
from .sqlite_tenants import ROW_TAG, open_clock
from .unreadable import readable

_OPEN_CHILD = (
    "SELECT EXISTS (SELECT 1 FROM jobs INDEXED BY jobs_children_status"
    " WHERE parent_id = ? AND status IN ('queued', 'processing'))"
)
"""At most two probes of ``jobs_children_status``, however many children the job has."""

_WAKE = f"UPDATE jobs SET run_at = ?, fair_tag = coalesce(fair_tag, {ROW_TAG}) WHERE seq = ?"
"""Due now and in its tenant's line now (a job not due has no tag: ``coalesce`` keeps one that
a caller with a clock ahead of ``now`` already gave it)."""


class SQLiteChildren:
    """Listing (by status, type, tenant or parent), ``wake`` and ``has_open_children`` of the
    ``Backend`` contract (see base.py) for ``SQLiteBackend``."""

    _executor: SQLiteExecutor

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        tenant: str | None = None,
        parent_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        clauses: list[str] = []
        params: list[Any] = []
        index = ""
        if parent_id is not None:
            # A parent's children, whatever else the filter says: bounded by the pipeline,
            # where a status, type or tenant may hold millions of jobs.
            clauses.append("parent_id = ?")
            params.append(parent_id)
            by_status = "jobs_children_status" if status is not None else "jobs_children"
            index = f" INDEXED BY {by_status}"
        if status is not None:
            clauses.append("status = ?")
            params.append(str(status))
        if type is not None:
            clauses.append("type = ?")
            params.append(type)
        if tenant is not None:
            clauses.append("tenant = ?")
            params.append(tenant)
        below = parse_cursor(cursor)
        if below is not None:
            clauses.append("seq < ?")
            params.append(below)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {COLUMNS} FROM jobs{index}{where} ORDER BY seq DESC LIMIT ?"
        params.append(limit + 1)

        def op(conn: sqlite3.Connection) -> Page:
            rows = conn.execute(sql, params).fetchall()
            more = len(rows) > limit
            rows = rows[:limit]
            next_cursor = str(rows[-1][0]) if more and rows else None
            return Page(readable(rows, row_to_job), next_cursor)

        return await self._executor.run(op, write=False)

    async def wake(self, task_id: str, *, now: float) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            found = conn.execute(
                "SELECT seq, type, priority FROM jobs WHERE task_id = ? AND status = 'queued'"
                " AND run_at > ?",
                (task_id, now),
            ).fetchone()
            if found is None:  # missing, not queued, or due already: nothing to do
                return False
            seq, type_, priority = found
            open_clock(conn, type_, priority)  # a job delayed at enqueue may be its queue's first
            conn.execute(_WAKE, (now, seq))
            return True

        return await self._executor.run(op)

    async def has_open_children(self, parent_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(_OPEN_CHILD, (parent_id,)).fetchone()[0])

        return await self._executor.run(op, write=False)
