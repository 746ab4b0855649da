"""The webhook outbox on SQLite: the ``webhooks`` table, one row per message.

``write_message`` runs inside the transaction that makes a job terminal (finish, cancel), so a
job never becomes terminal without its message. ``SQLiteWebhooks`` is mixed into
``SQLiteBackend``; each write is one operation of its writer, one ``BEGIN IMMEDIATE``
transaction, so two dispatchers (in any processes) never claim one message.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..errors import InvalidInputError, InvalidTransitionError, JobNotFoundError, LeaseLostError
from ..models import (
    PROGRESS_EVENT,
    WEBHOOK_EVENTS,
    Job,
    JobStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookStatus,
)
from .outbox import WEBHOOK_KEEP_S, new_message, new_msg_id
from .sqlite_executor import SQLiteExecutor
from .sqlite_schema import COLUMNS, row_to_job

_TERMINAL = ("completed", "failed", "cancelled")
_COLUMNS = "msg_id, task_id, event, url, status, created_at, next_at, body, attempts, claim, tries"


def write_message(conn: sqlite3.Connection, job: Job, now: float, event: str | None = None) -> None:
    """Add the pending message of ``job``, which has just become terminal (if it has a hook);
    or, with ``event``, that event's message."""
    message = new_message(job, now, event=event)
    if message is None:
        return
    conn.execute(
        "INSERT INTO webhooks (msg_id, task_id, event, url, status, created_at, next_at)"
        " VALUES (?, ?, ?, ?, 'pending', ?, ?)",
        (message.msg_id, job.task_id, message.event, message.url, now, now),
    )


def write_unreadable_message(conn: sqlite3.Connection, task_id: str, now: float) -> None:
    """``write_message`` for a job whose row does not parse (unreadable.py): from the columns
    it needs, which do. Its body is then made from the message alone (webhook_body)."""
    found = conn.execute(  # (as bytes: the damage may be there too)
        "SELECT CAST(webhook_url AS BLOB), status FROM jobs WHERE task_id = ?", (task_id,)
    ).fetchone()
    if found is None or found[0] is None or found[1] not in _TERMINAL:
        return
    try:
        url = found[0].decode()
    except UnicodeDecodeError:
        return  # no message to an address that cannot be read
    conn.execute(
        "INSERT INTO webhooks (msg_id, task_id, event, url, status, created_at, next_at)"
        " VALUES (?, ?, ?, ?, 'pending', ?, ?)",
        (new_msg_id(), task_id, WEBHOOK_EVENTS[JobStatus(found[1])], url, now, now),
    )


def delete_messages(conn: sqlite3.Connection, task_ids: list[tuple[str]]) -> None:
    """Drop the messages of deleted jobs."""
    conn.executemany("DELETE FROM webhooks WHERE task_id = ?", task_ids)


def _delivery(row: tuple[Any, ...]) -> WebhookDelivery:
    msg_id, task_id, event, url, status, created_at, next_at, body, attempts, claim, tries = row
    return WebhookDelivery(
        msg_id=msg_id,
        task_id=task_id,
        event=event,
        url=url,
        status=WebhookStatus(status),
        created_at=created_at,
        next_at=next_at,
        body=body,
        attempts=[WebhookAttempt.model_validate(a) for a in json.loads(attempts)],
        claim=claim,
        tries=tries,
    )


class SQLiteWebhooks:
    """The outbox methods of the ``Backend`` contract (see base.py) for ``SQLiteBackend``."""

    _executor: SQLiteExecutor

    async def claim_webhooks(
        self, *, now: float, limit: int, lease_s: float
    ) -> list[WebhookDelivery]:
        def op(conn: sqlite3.Connection) -> list[WebhookDelivery]:
            rows = conn.execute(
                "UPDATE webhooks SET next_at = :lease, claim = claim + 1 WHERE msg_id IN ("
                " SELECT msg_id FROM webhooks WHERE status = 'pending' AND next_at <= :now"
                " ORDER BY next_at, created_at LIMIT :limit)"
                f" RETURNING {_COLUMNS}",
                {"now": now, "lease": now + lease_s, "limit": limit},
            ).fetchall()
            rows.sort(key=lambda r: r[5])  # RETURNING has no order: oldest first again
            return [_delivery(r) for r in rows]

        return await self._executor.run(op)

    async def record_webhook_attempt(
        self,
        msg_id: str,
        claim: int,
        attempt: WebhookAttempt,
        *,
        status: WebhookStatus,
        next_at: float | None,
        body: str,
    ) -> bool:
        due = next_at if status is WebhookStatus.PENDING else None
        settled = None if status is WebhookStatus.PENDING else attempt.at

        def op(conn: sqlite3.Connection) -> bool:
            done = conn.execute(
                "UPDATE webhooks SET status = ?, next_at = ?, body = COALESCE(body, ?),"
                " attempts = json_insert(attempts, '$[#]', json(?)), settled_at = ?,"
                " tries = tries + 1 WHERE msg_id = ? AND status = 'pending' AND claim = ?",
                (status.value, due, body, attempt.model_dump_json(), settled, msg_id, claim),
            )
            if done.rowcount == 1 and due is not None:  # (its job outlives its next try)
                conn.execute(
                    "UPDATE jobs SET expires_at = :keep WHERE task_id ="
                    " (SELECT task_id FROM webhooks WHERE msg_id = :msg)"
                    " AND expires_at IS NOT NULL AND expires_at < :keep",
                    {"keep": due + WEBHOOK_KEEP_S, "msg": msg_id},
                )
            return done.rowcount == 1

        return await self._executor.run(op)

    async def webhook_deliveries(self, task_id: str) -> list[WebhookDelivery]:
        def op(conn: sqlite3.Connection) -> list[WebhookDelivery]:
            if conn.execute("SELECT 1 FROM jobs WHERE task_id = ?", (task_id,)).fetchone() is None:
                raise JobNotFoundError(task_id)
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM webhooks WHERE task_id = ? ORDER BY rowid",
                (task_id,),
            ).fetchall()
            return [_delivery(r) for r in rows]

        return await self._executor.run(op, write=False)

    async def redeliver_webhook(
        self, task_id: str, *, now: float, keep_until: float | None = None
    ) -> WebhookDelivery:
        def op(conn: sqlite3.Connection) -> WebhookDelivery:
            if conn.execute("SELECT 1 FROM jobs WHERE task_id = ?", (task_id,)).fetchone() is None:
                raise JobNotFoundError(task_id)
            row = conn.execute(
                "UPDATE webhooks SET status = 'pending', next_at = :now, settled_at = NULL,"
                " claim = claim + 1, tries = 0 WHERE msg_id = ("
                " SELECT msg_id FROM webhooks WHERE task_id = :task_id"
                " ORDER BY rowid DESC LIMIT 1)"
                f" RETURNING {_COLUMNS}",
                {"now": now, "task_id": task_id},
            ).fetchone()
            if row is None:
                raise InvalidTransitionError(f"job {task_id} has no webhook message to redeliver")
            if keep_until is not None:  # (a job still running has no expires_at yet)
                conn.execute(
                    "UPDATE jobs SET expires_at = :keep WHERE task_id = :task_id"
                    " AND expires_at IS NOT NULL AND expires_at < :keep",
                    {"keep": keep_until, "task_id": task_id},
                )
            return _delivery(row)

        return await self._executor.run(op)

    async def add_progress_webhook(self, task_id: str, fence: int, *, now: float) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE task_id = ? AND fence = ?"
                " AND status = 'processing'",
                (task_id, fence),
            ).fetchone()
            if row is None:
                raise LeaseLostError(task_id, fence)
            job = row_to_job(row)
            if job.webhook_url is None or not job.webhook_progress:
                return False
            waiting = conn.execute(
                "SELECT 1 FROM webhooks WHERE task_id = ? AND event = ? AND status = 'pending'"
                " AND body IS NULL",
                (task_id, PROGRESS_EVENT),
            ).fetchone()
            if waiting is not None:
                return False
            write_message(conn, job, now, event=PROGRESS_EVENT)
            return True

        return await self._executor.run(op)

    async def webhook_counts(self) -> dict[str, int]:
        def op(conn: sqlite3.Connection) -> dict[str, int]:
            counts = {status.value: 0 for status in WebhookStatus}
            for status, n in conn.execute("SELECT status, n FROM webhook_counts"):
                counts[status] = n
            return counts

        return await self._executor.run(op, write=False)

    async def failed_webhooks(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[WebhookDelivery], str | None]:
        after = _parse_failed_cursor(cursor)

        def op(conn: sqlite3.Connection) -> tuple[list[WebhookDelivery], str | None]:
            where = "status = 'failed'"
            params: tuple[Any, ...] = ()
            if after is not None:
                where += " AND (settled_at < ? OR (settled_at = ? AND msg_id < ?))"
                params = (after[0], after[0], after[1])
            rows = conn.execute(
                f"SELECT {_COLUMNS}, settled_at FROM webhooks WHERE {where}"
                " ORDER BY settled_at DESC, msg_id DESC LIMIT ?",
                (*params, limit + 1),
            ).fetchall()
            page = [_delivery(r[:-1]) for r in rows[:limit]]
            more = len(rows) > limit
            last = rows[limit - 1] if more else None
            return page, (f"{last[-1]!r}:{last[0]}" if last is not None else None)

        return await self._executor.run(op, write=False)


def _parse_failed_cursor(cursor: str | None) -> tuple[float, str] | None:
    if cursor is None:
        return None
    at, _, msg_id = cursor.partition(":")
    try:
        return float(at), msg_id
    except ValueError:
        raise InvalidInputError(f"not a cursor of this listing: {cursor!r}") from None
