"""The SQLite schema and the mapping between its rows and ``Job``."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..errors import BackendError
from ..models import Job

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    priority INTEGER NOT NULL,
    input TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at REAL NOT NULL,
    run_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0,
    progress_percent REAL NOT NULL DEFAULT 0,
    progress_message TEXT,
    result TEXT,
    error TEXT,
    usage TEXT,
    metadata TEXT NOT NULL,
    webhook_url TEXT,
    expires_at REAL,
    timeout_s REAL,
    deadline_at REAL,
    ttl_s REAL NOT NULL,
    idempotency_key TEXT,
    worker_id TEXT,
    lease_expires_at REAL,
    history TEXT NOT NULL DEFAULT '[]',
    event_seq INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs(idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs(priority DESC, run_at, seq) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS jobs_due ON jobs(run_at) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs(lease_expires_at) WHERE status = 'processing';
CREATE INDEX IF NOT EXISTS jobs_worker ON jobs(worker_id) WHERE status = 'processing';
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs(expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status, seq);
CREATE INDEX IF NOT EXISTS jobs_type ON jobs(type, seq);

CREATE TABLE IF NOT EXISTS events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT,
    at REAL NOT NULL,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS cancel_signals (
    worker_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    fence INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (worker_id, task_id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS workers (
    worker_id TEXT PRIMARY KEY,
    started_at REAL NOT NULL,
    last_seen REAL NOT NULL,
    running INTEGER NOT NULL
);

-- Counts by status, kept by triggers so the queue-size bound and stats cost O(1).
CREATE TABLE IF NOT EXISTS status_counts (status TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT OR IGNORE INTO status_counts VALUES
    ('queued', 0), ('processing', 0), ('completed', 0), ('failed', 0), ('cancelled', 0);
CREATE TRIGGER IF NOT EXISTS jobs_count_insert AFTER INSERT ON jobs BEGIN
    UPDATE status_counts SET n = n + 1 WHERE status = NEW.status;
END;
CREATE TRIGGER IF NOT EXISTS jobs_count_update AFTER UPDATE OF status ON jobs
    WHEN OLD.status != NEW.status BEGIN
    UPDATE status_counts SET n = n - 1 WHERE status = OLD.status;
    UPDATE status_counts SET n = n + 1 WHERE status = NEW.status;
END;
CREATE TRIGGER IF NOT EXISTS jobs_count_delete AFTER DELETE ON jobs BEGIN
    UPDATE status_counts SET n = n - 1 WHERE status = OLD.status;
END;
"""

COLUMNS = (
    "seq, task_id, type, status, priority, input, created_at, run_at, started_at, finished_at,"
    " attempts, max_attempts, fence, progress_percent, progress_message, result, error, usage,"
    " metadata, webhook_url, expires_at, timeout_s, deadline_at, ttl_s, idempotency_key,"
    " worker_id, lease_expires_at, history, event_seq"
)


def init_connection(conn: sqlite3.Connection, synchronous: str) -> None:
    """Pragmas and schema; fails with BackendError on a file that is not ours."""
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA temp_store=MEMORY")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise BackendError(
                f"database schema version {version} is not supported (expected {SCHEMA_VERSION})"
            )
        if version == 0:
            # One transaction, so a second process opening the file at once sees all or none.
            conn.executescript(
                f"BEGIN IMMEDIATE;{SCHEMA}PRAGMA user_version={SCHEMA_VERSION};COMMIT;"
            )
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise BackendError(f"cannot use the SQLite database: {exc}") from exc


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def row_to_job(row: tuple[Any, ...]) -> Job:
    """Build a Job from a row selected with COLUMNS.

    Validation in pydantic-core is several times faster than model_construct with nested
    models, and it re-checks what we read back.
    """
    return Job.model_validate(
        {
            "task_id": row[1],
            "type": row[2],
            "status": row[3],
            "priority": row[4],
            "input": json.loads(row[5]),
            "created_at": row[6],
            "run_at": row[7],
            "started_at": row[8],
            "finished_at": row[9],
            "attempts": row[10],
            "max_attempts": row[11],
            "fence": row[12],
            "progress": {"percent": row[13], "message": row[14]},
            "result": _loads(row[15]),
            "error": _loads(row[16]),
            "usage": _loads(row[17]),
            "metadata": json.loads(row[18]),
            "webhook_url": row[19],
            "expires_at": row[20],
            "timeout_s": row[21],
            "deadline_at": row[22],
            "ttl_s": row[23],
            "idempotency_key": row[24],
            "worker_id": row[25],
            "lease_expires_at": row[26],
            "history": json.loads(row[27]),
        }
    )
