"""The embedded backend: one SQLite file in WAL mode, shared by any processes on one machine.

Writes go through ``SQLiteExecutor`` (one thread, group commit). Every transition is a single
transaction guarded by ``BEGIN IMMEDIATE``, so several API and worker processes can share the
file: SQLite serialises their writers, and each statement re-checks the status and fence it
depends on inside that transaction.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ..errors import (
    BackendError,
    ConfigurationError,
    CorruptRecordError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidTransitionError,
    JobNotFoundError,
    LeaseLostError,
    QueueFullError,
)
from ..jsoncodec import encode
from ..models import ErrorInfo, Event, Job, JobStatus, Progress
from .base import (
    CHILD_KEEP_S,
    WORKER_RETENTION_S,
    NewJob,
    NextClaim,
    Outcome,
    Quota,
    RetryAt,
    Stats,
    Wait,
    WorkerInfo,
    replayable,
)
from .sqlite_children import SQLiteChildren
from .sqlite_executor import SQLiteExecutor
from .sqlite_outcomes import EncodedJSON, outcome_update
from .sqlite_schema import (
    ATTEMPTS,
    COLUMNS,
    EVENT_SEQ,
    FENCE,
    PRIORITY,
    SEQ,
    STATUS,
    TASK_ID,
    WORKER_ID,
    init_connection,
    row_to_job,
    rows_to_jobs,
    valid_json,
)
from .sqlite_slots import SQLiteSlots, purge_ended_slots
from .sqlite_tenants import (
    ROW_TAG,
    SQLiteTenants,
    admit,
    advance_clocks,
    check_in_flight,
    fair_tag,
    join_due,
    open_clock,
    open_clock_of,
    purge_tenant_state,
)
from .sqlite_wait import SQLiteWaits
from .sqlite_webhooks import (
    SQLiteWebhooks,
    delete_messages,
    write_message,
    write_unreadable_message,
)
from .unreadable import fail_unreadable

Unreadable = tuple[CorruptRecordError, int]
"""A claimed or expired job whose row does not parse, and its fence."""

_TERMINAL = ("completed", "failed", "cancelled")


def _dumps(value: Any) -> str:
    return encode(value, "data")


def _error_json(error: ErrorInfo) -> str:
    return _dumps(error.model_dump())


_QUEUED = EncodedJSON('{"status":"queued"}')

_INSERT = (
    "INSERT INTO jobs (task_id, type, status, priority, input, fingerprint, created_at, run_at,"
    " max_attempts, metadata, webhook_url, webhook_progress, traceparent, timeout_s,"
    " deadline_at, ttl_s, idempotency_key, tenant, fair_cost, parent_id, fair_tag, event_seq)"
    " VALUES (?1, ?2, 'queued', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,"
    " ?17, ?18, ?19, {tag}, 1)"
)
_INSERT_DUE = _INSERT.format(tag=fair_tag("?17", "?2", "?3", "?18"))
_INSERT_DELAYED = _INSERT.format(tag="NULL")


def _insert_event(
    conn: sqlite3.Connection, task_id: str, seq: int, type: str, data: Any, at: float
) -> None:
    encoded = data if isinstance(data, EncodedJSON) else _dumps(data)
    conn.execute(
        "INSERT INTO events (task_id, seq, type, data, at) VALUES (?, ?, ?, ?, ?)",
        (task_id, seq, type, encoded, at),
    )


def _missing_directory(path: str) -> str | None:
    directory = os.path.dirname(os.path.abspath(path))
    return None if os.path.isdir(directory) else directory


class SQLiteBackend(SQLiteSlots, SQLiteWebhooks, SQLiteTenants, SQLiteWaits, SQLiteChildren):
    """Backend on a SQLite file (``sqlite:///path.db``; ``sqlite://:memory:`` is refused)."""

    def __init__(
        self,
        path: str,
        *,
        max_queue_size: int | None = None,
        synchronous: str = "NORMAL",
        poll_interval_s: float = 0.002,
    ) -> None:
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(f"unknown SQLite synchronous mode {synchronous!r}")
        self.path = path
        self.max_queue_size = max_queue_size
        self._executor = SQLiteExecutor(
            path,
            init=lambda conn: init_connection(conn, synchronous.upper()),
            poll_interval_s=poll_interval_s,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> None:
        try:
            await self._executor.start()
        except BackendError as exc:
            reason = str(exc)
            missing = await asyncio.to_thread(_missing_directory, self.path)
            if missing is not None:
                reason = f"directory {missing!r} does not exist"
            raise BackendError(f"cannot open SQLite database {self.path!r}: {reason}") from None

    async def close(self) -> None:
        await self._executor.stop()

    # -- producers ---------------------------------------------------------------------------

    async def enqueue(self, job: NewJob, *, quota: Quota | None = None) -> tuple[Job, bool]:
        max_queue_size = self.max_queue_size
        due = job.run_at <= job.created_at
        values = (
            job.task_id,
            job.type,
            job.priority,
            _dumps(job.input),
            job.fingerprint,
            job.created_at,
            job.run_at,
            job.max_attempts,
            _dumps(job.metadata),
            job.webhook_url,
            int(job.webhook_progress),
            job.traceparent,
            job.timeout_s,
            job.deadline_at,
            job.ttl_s,
            job.idempotency_key,
            job.tenant,
            job.fair_cost,
            job.parent_id,
        )

        def op(conn: sqlite3.Connection) -> Job | None:
            if job.idempotency_key is not None or max_queue_size is not None or quota is not None:
                # Else the insert is the first check that can fail, and its key does this one.
                taken = conn.execute("SELECT 1 FROM jobs WHERE task_id = ?", (job.task_id,))
                if taken.fetchone() is not None:
                    raise BackendError(f"a job with id {job.task_id} already exists")
            if job.idempotency_key is not None:
                row = conn.execute(
                    f"SELECT {COLUMNS}, tenant, fingerprint FROM jobs WHERE idempotency_key = ?",
                    (job.idempotency_key,),
                ).fetchone()
                if row is not None:
                    if row[-2] != job.tenant:
                        raise IdempotencyConflictError(job.idempotency_key, "")
                    if row[-1] != job.fingerprint:
                        raise IdempotencyConflictError(job.idempotency_key, row[TASK_ID])
                    return row_to_job(row)
            if max_queue_size is not None:
                (queued,) = conn.execute(
                    "SELECT n FROM status_counts WHERE status = 'queued'"
                ).fetchone()
                if queued >= max_queue_size:
                    raise QueueFullError(
                        f"the queue holds {queued} jobs, its limit (max_queue_size) is "
                        f"{max_queue_size}"
                    )
            admit(conn, job, quota)
            if due:
                open_clock(conn, job.type, job.priority)
            # A job due at once joins its tenant's line now, a delayed one when due (claim).
            conn.execute(_INSERT_DUE if due else _INSERT_DELAYED, values)
            _insert_event(conn, job.task_id, 1, "status", _QUEUED, job.created_at)
            return None

        existing = await self._executor.run(op)
        if existing is not None:
            return existing, False
        # The new row holds exactly what ``job`` says: build it here, not in the writer thread.
        return job.to_job(input=json.loads(values[3]), metadata=json.loads(values[8])), True

    # -- reads -------------------------------------------------------------------------------

    async def get(self, task_id: str) -> Job | None:
        def op(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE task_id = ?", (task_id,))
            found = row.fetchone()
            return None if found is None else row_to_job(found)

        return await self._executor.run(op, write=False)

    async def job_status(self, task_id: str) -> JobStatus | None:
        def op(conn: sqlite3.Connection) -> JobStatus | None:
            found = conn.execute("SELECT status FROM jobs WHERE task_id = ?", (task_id,))
            row = found.fetchone()
            if row is None:
                return None
            try:
                return JobStatus(row[0])
            except ValueError:
                raise CorruptRecordError(task_id, f"status: {str(row[0])[:40]!r}") from None

        return await self._executor.run(op, write=False)

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        def op(conn: sqlite3.Connection) -> list[Event]:
            rows = conn.execute(
                "SELECT seq, type, data, at FROM events WHERE task_id = ? AND seq > ?"
                " ORDER BY seq LIMIT ?",
                (task_id, after, limit),
            ).fetchall()
            events = []
            for seq, type_, data, at in rows:
                try:
                    value = json.loads(data)
                except (ValueError, TypeError) as exc:  # (a row damaged by hand or by a disk)
                    raise CorruptRecordError(task_id, f"event {seq}: {exc!s:.80}") from None
                events.append(
                    Event.model_construct(task_id=task_id, seq=seq, type=type_, data=value, at=at)
                )
            return events

        return await self._executor.run(op, write=False)

    # -- workers -----------------------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        *,
        limit: int,
        now: float,
        lease_s: float,
        types: Sequence[str] | None = None,
    ) -> list[Job]:
        if limit <= 0 or (types is not None and not types):
            return []
        worker = f'"worker_id":{_dumps(worker_id)}'
        of_types = "" if types is None else " AND type IN (SELECT value FROM json_each(:types))"
        sql = (
            "UPDATE jobs SET status = 'processing', attempts = attempts + 1,"
            " fence = fence + 1, worker_id = :worker, lease_expires_at = :lease,"
            " started_at = :now, event_seq = event_seq + 1,"
            f" history = iif({valid_json('history')}, json_insert(history, '$[#]',"
            " json_object('attempt', attempts + 1, 'worker_id', :worker, 'started_at', :now)),"
            " history)"
            " WHERE seq IN (SELECT seq FROM jobs INDEXED BY jobs_claim"
            " WHERE status = 'queued' AND fair_tag IS NOT NULL"
            f" AND run_at <= :now{of_types}"
            " ORDER BY priority DESC, fair_tag, seq LIMIT :limit)"
            f" RETURNING {COLUMNS}, type, fair_tag"
        )
        params = {
            "worker": worker_id,
            "lease": now + lease_s,
            "now": now,
            "limit": limit,
            "types": None if types is None else _dumps(list(types)),
        }

        def op(conn: sqlite3.Connection) -> tuple[list[Job], list[Unreadable]]:
            join_due(conn, now)
            rows = conn.execute(sql, params).fetchall()
            rows.sort(key=lambda r: (-r[PRIORITY], r[-1], r[SEQ]))
            advance_clocks(conn, [(r[-2], r[PRIORITY], r[-1]) for r in rows])
            conn.executemany(
                "INSERT INTO events (task_id, seq, type, data, at) VALUES (?, ?, 'status', ?, ?)",
                [
                    (
                        r[TASK_ID],
                        r[EVENT_SEQ],
                        f'{{"status":"processing","attempt":{r[ATTEMPTS]},{worker}}}',
                        now,
                    )
                    for r in rows
                ],
            )
            return rows_to_jobs(rows)

        jobs, unreadable = await self._executor.run(op)
        await self._fail_unreadable(unreadable, now)
        return jobs

    async def _fail_unreadable(
        self, unreadable: list[Unreadable], now: float, *, expired_only: bool = False
    ) -> None:
        """Fail the jobs this worker holds (or, ``expired_only``, whose leases ended) whose
        records cannot be read (unreadable.py)."""
        for exc, fence in unreadable:
            await fail_unreadable(self, exc, fence, now=now, expired_only=expired_only)

    async def heartbeat(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lease_s: float
    ) -> dict[str, int]:
        encoded = _dumps(dict(held))

        def op(conn: sqlite3.Connection) -> dict[str, int]:
            renewed = conn.execute(
                "UPDATE jobs SET lease_expires_at = :lease FROM json_each(:held) AS h"
                " WHERE jobs.task_id = h.key AND jobs.fence = h.value"
                " AND jobs.status = 'processing' AND jobs.worker_id = :worker"
                " RETURNING jobs.task_id, jobs.fence",
                {"lease": now + lease_s, "held": encoded, "worker": worker_id},
            ).fetchall()
            conn.execute(
                "INSERT INTO workers (worker_id, started_at, last_seen, running)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (worker_id)"
                " DO UPDATE SET last_seen = excluded.last_seen, running = excluded.running",
                (worker_id, now, now, len(held)),
            )
            return dict(renewed)

        return await self._executor.run(op)

    async def append_event(
        self,
        task_id: str,
        fence: int,
        type: str,
        data: Any,
        *,
        now: float,
        progress: Progress | None = None,
    ) -> int:
        try:
            encoded = _dumps(data)
        except InvalidInputError as exc:
            await self._raise_unless_held(task_id, fence, exc)
        if progress is None:
            sql = (
                "UPDATE jobs SET event_seq = event_seq + 1 WHERE task_id = ? AND fence = ?"
                " AND status = 'processing' RETURNING event_seq"
            )
            params: tuple[Any, ...] = (task_id, fence)
        else:
            sql = (
                "UPDATE jobs SET event_seq = event_seq + 1, progress_percent = ?,"
                " progress_message = ? WHERE task_id = ? AND fence = ?"
                " AND status = 'processing' RETURNING event_seq"
            )
            params = (progress.percent, progress.message, task_id, fence)

        def op(conn: sqlite3.Connection) -> int:
            row = conn.execute(sql, params).fetchone()
            if row is None:
                raise LeaseLostError(task_id, fence)
            conn.execute(
                "INSERT INTO events (task_id, seq, type, data, at) VALUES (?, ?, ?, ?, ?)",
                (task_id, row[0], type, encoded, now),
            )
            return int(row[0])

        return await self._executor.run(op)

    async def finish(
        self,
        task_id: str,
        fence: int,
        outcome: Outcome,
        *,
        now: float,
        only_if_lease_expired: bool = False,
        claimed: Job | None = None,
        then_claim: NextClaim | None = None,
    ) -> Job:
        guard = "task_id = :task_id AND fence = :fence AND status = 'processing'"
        if only_if_lease_expired:
            guard += " AND lease_expires_at <= :now"
        try:
            update = outcome_update(outcome)
        except InvalidInputError as exc:
            await self._raise_unless_held(task_id, fence, exc)
        params = {**update.params, "task_id": task_id, "fence": fence, "now": now}
        events = update.events
        # A Release keeps the job's fair-share tag (first again); a retry or a wait joins the
        # back of its tenant's line, now if due at once, else when due (at a claim, or wake).
        sets = update.sets
        rejoins = isinstance(outcome, RetryAt | Wait) and outcome.run_at <= now
        if isinstance(outcome, RetryAt | Wait):
            sets += f", fair_tag = iif(:run_at <= :now, {ROW_TAG}, NULL)"
        sql = f"UPDATE jobs SET {sets} WHERE {guard} RETURNING {COLUMNS}"

        def op(conn: sqlite3.Connection) -> Job | CorruptRecordError:
            if rejoins:
                open_clock_of(conn, task_id)
            row = conn.execute(sql, params).fetchone()
            if row is None:
                raise LeaseLostError(task_id, fence)
            last = row[EVENT_SEQ]
            first = last - len(events) + 1
            for offset, (type_, data) in enumerate(events):
                data = {**data, "attempt": row[ATTEMPTS]} if type_ == "attempt_failed" else data
                _insert_event(conn, task_id, first + offset, type_, data, now)
            try:
                job = row_to_job(row)
            except CorruptRecordError as exc:
                # Applied all the same (a worker fails an unreadable job so), then raised.
                write_unreadable_message(conn, task_id, now)
                return exc
            if job.webhook_url is not None and job.is_terminal:
                write_message(conn, job, now)
            return job

        finished = await self._executor.run(op)
        if isinstance(finished, CorruptRecordError):
            raise finished
        return finished

    async def _raise_unless_held(self, task_id: str, fence: int, error: Exception) -> NoReturn:
        """A stale writer hears about its lease first, whatever else is wrong with its write."""

        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT 1 FROM jobs WHERE task_id = ? AND fence = ? AND status = 'processing'",
                (task_id, fence),
            ).fetchone()
            return row is not None

        if not await self._executor.run(op, write=False):
            raise LeaseLostError(task_id, fence)
        raise error

    async def cancel(self, task_id: str, *, now: float) -> tuple[Job, bool]:
        def op(conn: sqlite3.Connection) -> tuple[Job, bool]:
            found = conn.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE task_id = ?", (task_id,)
            ).fetchone()
            if found is None:
                raise JobNotFoundError(task_id)
            status = found[STATUS]
            if status in _TERMINAL:
                return row_to_job(found), False
            history = (
                f"iif({valid_json('history')}, json_set(history, '$[#-1].finished_at', :now,"
                " '$[#-1].outcome', 'cancelled'), history)"
                if status == "processing"
                else "history"
            )
            row = conn.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = :now,"
                " expires_at = :now + ttl_s, lease_expires_at = NULL,"
                f" event_seq = event_seq + 1, history = {history}"
                f" WHERE task_id = :task_id RETURNING {COLUMNS}",
                {"now": now, "task_id": task_id},
            ).fetchone()
            if status == "processing":
                conn.execute(
                    "INSERT OR REPLACE INTO cancel_signals (worker_id, task_id, fence, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (found[WORKER_ID], task_id, found[FENCE], now),
                )
            _insert_event(conn, task_id, row[EVENT_SEQ], "status", {"status": "cancelled"}, now)
            job = row_to_job(row)
            write_message(conn, job, now)
            return job, True

        return await self._executor.run(op)

    async def poll_cancellations(self, worker_id: str) -> dict[str, int]:
        def op(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                "DELETE FROM cancel_signals WHERE worker_id = ? RETURNING task_id, fence",
                (worker_id,),
            ).fetchall()
            return dict(rows)

        return await self._executor.run(op)

    # -- admin -------------------------------------------------------------------------------

    async def replay(
        self,
        task_id: str,
        *,
        now: float,
        extra_attempts: int,
        quota: Quota | None = None,
        cancelled_too: bool = False,
    ) -> Job:
        def op(conn: sqlite3.Connection) -> Job:
            found = conn.execute(
                "SELECT status, tenant, type, priority, parent_id FROM jobs WHERE task_id = ?",
                (task_id,),
            )
            status = found.fetchone()
            if status is None:
                raise JobNotFoundError(task_id)
            if not replayable(status[0], cancelled_too):
                raise InvalidTransitionError(
                    f"only failed jobs can be replayed; job {task_id} is {status[0]}"
                )
            if status[4] is None:  # (a pipeline's child counts as its parent's work)
                check_in_flight(conn, status[1], quota)
            open_clock(conn, status[2], status[3])
            row = conn.execute(
                "UPDATE jobs SET status = 'queued', max_attempts = attempts + :extra,"
                " run_at = :now, finished_at = NULL, expires_at = NULL, error = NULL,"
                " deadline_at = :now + (deadline_at - created_at), worker_id = NULL,"
                f" fair_tag = {ROW_TAG}, event_seq = event_seq + 1 WHERE task_id = :task_id"
                f" RETURNING {COLUMNS}",
                {"extra": extra_attempts, "now": now, "task_id": task_id},
            ).fetchone()
            _insert_event(
                conn, task_id, row[EVENT_SEQ], "status", {"status": "queued", "replayed": True}, now
            )
            return row_to_job(row)

        return await self._executor.run(op)

    async def delete(self, task_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            found = conn.execute("SELECT status FROM jobs WHERE task_id = ?", (task_id,))
            status = found.fetchone()
            if status is None:
                return False
            if status[0] not in _TERMINAL:
                raise InvalidTransitionError(
                    f"job {task_id} is {status[0]}; only terminal jobs can be deleted"
                    " (cancel it first)"
                )
            conn.execute("DELETE FROM jobs WHERE task_id = ?", (task_id,))
            conn.execute("DELETE FROM events WHERE task_id = ?", (task_id,))
            # (A cancel signal waiting for the job's worker stays for it to read: taken with
            # the job, the cancelled attempt ran on until the worker's next heartbeat.)
            delete_messages(conn, [(task_id,)])
            return True

        return await self._executor.run(op)

    # -- sweeper -----------------------------------------------------------------------------

    async def expired_leases(self, *, now: float, limit: int) -> list[Job]:
        def op(conn: sqlite3.Connection) -> tuple[list[Job], list[Unreadable]]:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM jobs INDEXED BY jobs_lease WHERE status = 'processing'"
                " AND lease_expires_at <= ? ORDER BY lease_expires_at LIMIT ?",
                (now, limit),
            ).fetchall()
            return rows_to_jobs(rows)

        jobs, unreadable = await self._executor.run(op, write=False)
        # A record no one can read is failed where its lease ran out (the sweeper's place),
        # if it still has: a heartbeat may have renewed it since the read.
        await self._fail_unreadable(unreadable, now, expired_only=True)
        return jobs

    async def purge_expired(self, *, now: float, limit: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            ids = []
            for task_id, keep in conn.execute(
                # A child whose parent is stored is kept until its parent's expiry (CHILD_KEEP_S
                # while its parent runs): NULL (no parent, or it is gone) lets it go.
                "SELECT child.task_id, iif(parent.task_id IS NULL, NULL,"
                " coalesce(parent.expires_at, :now + :keep)) FROM jobs AS child"
                " LEFT JOIN jobs AS parent ON parent.task_id = child.parent_id"
                " WHERE child.expires_at <= :now LIMIT :limit",
                {"now": now, "keep": CHILD_KEEP_S, "limit": limit},
            ).fetchall():
                if keep is not None and keep > now:
                    conn.execute(
                        "UPDATE jobs SET expires_at = ? WHERE task_id = ?", (keep, task_id)
                    )
                else:
                    ids.append((task_id,))
            conn.executemany("DELETE FROM jobs WHERE task_id = ?", ids)
            conn.executemany("DELETE FROM events WHERE task_id = ?", ids)
            delete_messages(conn, ids)
            # A signal for a worker that died before reading it would otherwise stay forever.
            conn.execute("DELETE FROM cancel_signals WHERE created_at <= ?", (now - 3600,))
            conn.execute("DELETE FROM workers WHERE last_seen < ?", (now - WORKER_RETENTION_S,))
            purge_ended_slots(conn, now)  # rows of keys nobody acquires again would stay
            purge_tenant_state(conn, now)  # and rows of tenants that went away
            return len(ids)

        return await self._executor.run(op)

    async def stats(self, *, now: float, worker_window_s: float = 60.0) -> Stats:
        def op(conn: sqlite3.Connection) -> Stats:
            counts = {
                JobStatus(status): n
                for status, n in conn.execute("SELECT status, n FROM status_counts")
            }
            by_priority: dict[int, int] = {}
            for priority, n in conn.execute(
                "SELECT priority, count(*) FROM jobs INDEXED BY jobs_claim"
                " WHERE status = 'queued' AND fair_tag IS NOT NULL GROUP BY priority"
                " UNION ALL SELECT priority, count(*) FROM jobs INDEXED BY jobs_untagged"
                " WHERE status = 'queued' AND fair_tag IS NULL GROUP BY priority"
            ):
                by_priority[priority] = by_priority.get(priority, 0) + n
            by_priority = dict(sorted(by_priority.items(), reverse=True))
            workers = [
                WorkerInfo(worker_id=w, started_at=s, last_seen=seen, running=r)
                for w, s, seen, r in conn.execute(
                    "SELECT worker_id, started_at, last_seen, running FROM workers"
                    " WHERE last_seen >= ? ORDER BY worker_id",
                    (now - worker_window_s,),
                )
            ]
            # Only a job due joins its tenant's line (gets its tag): those not due yet are
            # untagged ones, found by their run_at in the untagged index.
            (later,) = conn.execute(
                "SELECT count(*) FROM jobs INDEXED BY jobs_untagged"
                " WHERE status = 'queued' AND fair_tag IS NULL AND run_at > ?",
                (now,),
            ).fetchone()
            due = counts.get(JobStatus.QUEUED, 0) - later
            return Stats(counts, by_priority, counts[JobStatus.FAILED], workers, due)

        return await self._executor.run(op, write=False)
