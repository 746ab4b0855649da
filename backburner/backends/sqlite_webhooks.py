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

from ..errors import InvalidTransitionError, JobNotFoundError
from ..models import Job, WebhookAttempt, WebhookDelivery, WebhookStatus
from .outbox import new_message
from .sqlite_executor import SQLiteExecutor

_COLUMNS = "msg_id, task_id, event, url, status, created_at, next_at, body, attempts"


def write_message(conn: sqlite3.Connection, job: Job, now: float) -> None:
    """Add the pending message of ``job``, which has just become terminal (if it has a hook)."""
    message = new_message(job, now)
    if message is None:
        return
    conn.execute(
        f"INSERT INTO webhooks ({_COLUMNS}) VALUES (?, ?, ?, ?, 'pending', ?, ?, NULL, '[]')",
        (message.msg_id, job.task_id, message.event, message.url, now, now),
    )


def delete_messages(conn: sqlite3.Connection, task_ids: list[tuple[str]]) -> None:
    """Drop the messages of deleted jobs."""
    conn.executemany("DELETE FROM webhooks WHERE task_id = ?", task_ids)


def _delivery(row: tuple[Any, ...]) -> WebhookDelivery:
    msg_id, task_id, event, url, status, created_at, next_at, body, attempts = row
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
    )


class SQLiteWebhooks:
    """The outbox methods of the ``Backend`` contract (see base.py) for ``SQLiteBackend``."""

    _executor: SQLiteExecutor

    async def claim_webhooks(
        self, *, now: float, limit: int, lease_s: float
    ) -> list[WebhookDelivery]:
        def op(conn: sqlite3.Connection) -> list[WebhookDelivery]:
            rows = conn.execute(
                f"UPDATE webhooks SET next_at = :lease WHERE msg_id IN ("
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
        attempt: WebhookAttempt,
        *,
        status: WebhookStatus,
        next_at: float | None,
        body: str,
    ) -> None:
        due = next_at if status is WebhookStatus.PENDING else None

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE webhooks SET status = ?, next_at = ?, body = COALESCE(body, ?),"
                " attempts = json_insert(attempts, '$[#]', json(?)) WHERE msg_id = ?",
                (status.value, due, body, attempt.model_dump_json(), msg_id),
            )

        await self._executor.run(op)

    async def webhook_deliveries(self, task_id: str) -> list[WebhookDelivery]:
        def op(conn: sqlite3.Connection) -> list[WebhookDelivery]:
            if conn.execute("SELECT 1 FROM jobs WHERE task_id = ?", (task_id,)).fetchone() is None:
                raise JobNotFoundError(task_id)
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM webhooks WHERE task_id = ? ORDER BY created_at, msg_id",
                (task_id,),
            ).fetchall()
            return [_delivery(r) for r in rows]

        return await self._executor.run(op, write=False)

    async def redeliver_webhook(self, task_id: str, *, now: float) -> WebhookDelivery:
        def op(conn: sqlite3.Connection) -> WebhookDelivery:
            if conn.execute("SELECT 1 FROM jobs WHERE task_id = ?", (task_id,)).fetchone() is None:
                raise JobNotFoundError(task_id)
            row = conn.execute(
                f"UPDATE webhooks SET status = 'pending', next_at = :now WHERE msg_id = ("
                " SELECT msg_id FROM webhooks WHERE task_id = :task_id"
                " ORDER BY created_at DESC LIMIT 1)"
                f" RETURNING {_COLUMNS}",
                {"now": now, "task_id": task_id},
            ).fetchone()
            if row is None:
                raise InvalidTransitionError(f"job {task_id} has no webhook message to redeliver")
            return _delivery(row)

        return await self._executor.run(op)
