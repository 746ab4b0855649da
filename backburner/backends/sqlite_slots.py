"""Concurrency slots on SQLite: the ``slots`` table, one row per holder until its lease ends.

``SQLiteSlots`` is mixed into ``SQLiteBackend``. Each write is one operation of the backend's
writer (``SQLiteExecutor``), so it runs inside one ``BEGIN IMMEDIATE`` transaction: processes
sharing the file take SQLite's write lock in turn, and an acquire's count and insert see no
other writer in between.
"""

from __future__ import annotations

import sqlite3

from .base import check_slot_args
from .sqlite_executor import SQLiteExecutor


def purge_ended_slots(conn: sqlite3.Connection, now: float) -> None:
    """Drop every holder whose lease ended (the sweeper's housekeeping, for abandoned keys)."""
    conn.execute("DELETE FROM slots WHERE expires_at <= ?", (now,))


class SQLiteSlots:
    """The slot methods of the ``Backend`` contract (see base.py) for ``SQLiteBackend``."""

    _executor: SQLiteExecutor

    async def acquire_slot(
        self, key: str, holder: str, *, limit: int, lease_s: float, now: float
    ) -> bool:
        check_slot_args(key, holder, limit=limit, lease_s=lease_s)
        expires_at = now + lease_s

        def op(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM slots WHERE key = ? AND expires_at <= ?", (key, now))
            renewed = conn.execute(
                "UPDATE slots SET expires_at = ? WHERE key = ? AND holder = ?",
                (expires_at, key, holder),
            )
            if renewed.rowcount:
                return True
            (held,) = conn.execute("SELECT count(*) FROM slots WHERE key = ?", (key,)).fetchone()
            if held >= limit:
                return False
            conn.execute(
                "INSERT INTO slots (key, holder, expires_at) VALUES (?, ?, ?)",
                (key, holder, expires_at),
            )
            return True

        return await self._executor.run(op)

    async def renew_slot(self, key: str, holder: str, *, lease_s: float, now: float) -> bool:
        check_slot_args(key, holder, lease_s=lease_s)

        def op(conn: sqlite3.Connection) -> bool:
            renewed = conn.execute(
                "UPDATE slots SET expires_at = ? WHERE key = ? AND holder = ? AND expires_at > ?",
                (now + lease_s, key, holder, now),
            )
            return renewed.rowcount > 0

        return await self._executor.run(op)

    async def release_slot(self, key: str, holder: str) -> None:
        check_slot_args(key, holder)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM slots WHERE key = ? AND holder = ?", (key, holder))

        await self._executor.run(op)

    async def slots_in_use(self, key: str, *, now: float) -> int:
        check_slot_args(key)

        def op(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT count(*) FROM slots WHERE key = ? AND expires_at > ?", (key, now)
            ).fetchone()
            return int(row[0])

        return await self._executor.run(op, write=False)
