"""Waiting on SQLite: for due jobs and for new events, woken by commits of any process.

``SQLiteWaits`` is mixed into ``SQLiteBackend``. The executor notices commits of this
connection and of other processes (``PRAGMA data_version``) and resolves the futures of
``watch``; each waiter looks with a cheap read, then waits for the next commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Mapping, Sequence

from ..jsoncodec import encode
from ..models import Job
from .sqlite_executor import SQLiteExecutor


class SQLiteWaits:
    """The waiting methods of the ``Backend`` contract (see base.py) for ``SQLiteBackend``."""

    _executor: SQLiteExecutor

    async def wait_for_jobs(
        self,
        *,
        now: float,
        timeout: float,
        types: Sequence[str] | None = None,
        worker_id: str | None = None,
        lease_s: float = 30.0,
        on_handed: Callable[[Job], None] | None = None,
    ) -> list[Job]:
        await self._wait_for_jobs(now, timeout, types)
        return []  # no hand-off: a claim is a local transaction

    async def stop_waiting(self, worker_id: str) -> list[Job]:
        return []

    async def _wait_for_jobs(self, now: float, timeout: float, types: Sequence[str] | None) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        of_types = "" if types is None else " AND type IN (SELECT value FROM json_each(?))"
        sql = f"SELECT min(run_at) FROM jobs INDEXED BY jobs_due WHERE status = 'queued'{of_types}"
        params = () if types is None else (encode(list(types), "data"),)
        # Another process's commit wakes us, but most commits (events, heartbeats) add no
        # work: look with a cheap read before the caller tries a claim, which writes.
        while True:
            changed = self._executor.watch()
            try:
                next_due = await self._executor.run(
                    lambda conn: conn.execute(sql, params).fetchone()[0], write=False
                )
                elapsed = loop.time() - started
                if (next_due is not None and next_due <= now + elapsed) or elapsed >= timeout:
                    return
                wait = timeout - elapsed
                if next_due is not None:
                    wait = min(wait, next_due - now - elapsed)
                await asyncio.wait({changed}, timeout=wait)
            finally:
                self._executor.unwatch(changed)

    async def wait_for_events(self, after: Mapping[str, int], *, timeout: float) -> dict[str, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        params = (encode(dict(after), "data"),)

        def heads(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                "SELECT a.key, coalesce(jobs.event_seq, 0) FROM json_each(?) AS a"
                " LEFT JOIN jobs ON jobs.task_id = a.key"
                " WHERE jobs.event_seq IS NULL OR jobs.event_seq > a.value",
                params,
            ).fetchall()
            return dict(rows)

        while True:
            changed = self._executor.watch()
            try:
                grown = await self._executor.run(heads, write=False)
                left = deadline - loop.time()
                if grown or left <= 0:
                    return grown
                await asyncio.wait({changed}, timeout=left)
            finally:
                self._executor.unwatch(changed)
