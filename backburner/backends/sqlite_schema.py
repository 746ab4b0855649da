"""The SQLite schema and the mapping between its rows and ``Job``."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..errors import BackendError, CorruptRecordError
from ..models import Job, stored_job

SCHEMA_VERSION = 1

ADDED_SINCE_VERSION_1 = """
-- Also added since version 1: columns of jobs (_ADDED_COLUMNS, see _upgrade_version_1).
-- Concurrency slots (sqlite_slots.py): one row per holder of a slot, until its lease ends.
CREATE TABLE IF NOT EXISTS slots (
    key TEXT NOT NULL,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key, holder)
) WITHOUT ROWID;
-- The webhook outbox (sqlite_webhooks.py): one row per message, written with the terminal
-- transition of its job, with its delivery log (a JSON array of attempts).
CREATE TABLE IF NOT EXISTS webhooks (
    msg_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    event TEXT NOT NULL,
    url TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    next_at REAL,
    body TEXT,
    attempts TEXT NOT NULL DEFAULT '[]',
    settled_at REAL,
    claim INTEGER NOT NULL DEFAULT 0,
    tries INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS webhooks_due ON webhooks (next_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS webhooks_failed ON webhooks (settled_at DESC, msg_id DESC)
    WHERE status = 'failed';
CREATE INDEX IF NOT EXISTS webhooks_task ON webhooks (task_id, created_at);
-- Messages by status, kept by triggers: /metrics (which needs no key) and stats read them at
-- every scrape; counting the table took 0.7 s with a day's 310,000 messages.
CREATE TABLE IF NOT EXISTS webhook_counts (status TEXT PRIMARY KEY, n INTEGER NOT NULL)
    WITHOUT ROWID;
INSERT OR IGNORE INTO webhook_counts VALUES ('pending', 0), ('delivered', 0), ('failed', 0);
CREATE TRIGGER IF NOT EXISTS webhooks_count_insert AFTER INSERT ON webhooks BEGIN
    UPDATE webhook_counts SET n = n + 1 WHERE status = NEW.status;
END;
CREATE TRIGGER IF NOT EXISTS webhooks_count_update AFTER UPDATE OF status ON webhooks
    WHEN OLD.status != NEW.status BEGIN
    UPDATE webhook_counts SET n = n - 1 WHERE status = OLD.status;
    UPDATE webhook_counts SET n = n + 1 WHERE status = NEW.status;
END;
CREATE TRIGGER IF NOT EXISTS webhooks_count_delete AFTER DELETE ON webhooks BEGIN
    UPDATE webhook_counts SET n = n - 1 WHERE status = OLD.status;
END;
-- Tenants (sqlite_tenants.py). The claim order: within a priority, by fair-share tag; a queued
-- job without a tag has not joined its tenant's line yet (it is not due, or was queued by an
-- earlier release): the claim gives the due ones their tags first (jobs_untagged).
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs(priority DESC, fair_tag, seq, run_at)
    WHERE status = 'queued' AND fair_tag IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_untagged ON jobs(run_at, priority)
    WHERE status = 'queued' AND fair_tag IS NULL;
-- Whether a job waits in a ready queue (a type at a priority): one with none starts level with
-- the others when a job joins it (sqlite_tenants.open_clock).
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs(type, priority)
    WHERE status = 'queued' AND fair_tag IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs(tenant, seq);
-- Pipelines (sqlite_children.py): a job's children, newest first (list_jobs(parent_id=...)), and
-- by status (has_open_children, list_jobs(parent_id=..., status=...)). Partial: a job that is
-- nobody's child (most) costs neither index anything.
CREATE INDEX IF NOT EXISTS jobs_children ON jobs(parent_id, seq) WHERE parent_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_children_status ON jobs(parent_id, status, seq)
    WHERE parent_id IS NOT NULL;
-- Each tenant's line at each priority: its jobs queued or processing (their sum over the
-- priorities is what Quota.max_in_flight bounds) and its last fair-share tag, kept by triggers
-- on jobs (one row, so an enqueue writes one page for both). A tag is written only when a job
-- joins its tenant's line (sqlite_tenants.fair_tag), and tags of a line only grow.
CREATE TABLE IF NOT EXISTS tenant_lines (
    tenant TEXT NOT NULL,
    type TEXT NOT NULL,
    priority INTEGER NOT NULL,
    in_flight INTEGER NOT NULL,
    last_tag INTEGER NOT NULL,
    PRIMARY KEY (tenant, type, priority)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS jobs_line_insert AFTER INSERT ON jobs
    WHEN NEW.status IN ('queued', 'processing') OR NEW.fair_tag IS NOT NULL BEGIN
    INSERT INTO tenant_lines (tenant, type, priority, in_flight, last_tag)
        VALUES (NEW.tenant, NEW.type, NEW.priority,
            NEW.status IN ('queued', 'processing') AND NEW.parent_id IS NULL,
            coalesce(NEW.fair_tag, 0))
        ON CONFLICT (tenant, type, priority) DO UPDATE
            SET in_flight = in_flight + excluded.in_flight,
            last_tag = max(last_tag, excluded.last_tag);
END;
CREATE TRIGGER IF NOT EXISTS jobs_line_status AFTER UPDATE OF status ON jobs
    WHEN (OLD.status IN ('queued', 'processing')) != (NEW.status IN ('queued', 'processing'))
    BEGIN
    INSERT INTO tenant_lines (tenant, type, priority, in_flight, last_tag)
        VALUES (NEW.tenant, NEW.type, NEW.priority,
            iif(NEW.parent_id IS NOT NULL, 0, iif(NEW.status IN ('queued', 'processing'), 1, -1)),
            0)
        ON CONFLICT (tenant, type, priority) DO UPDATE
            SET in_flight = in_flight + excluded.in_flight;
END;
CREATE TRIGGER IF NOT EXISTS jobs_line_tag AFTER UPDATE OF fair_tag ON jobs
    WHEN NEW.fair_tag IS NOT NULL BEGIN
    INSERT INTO tenant_lines (tenant, type, priority, in_flight, last_tag)
        VALUES (NEW.tenant, NEW.type, NEW.priority, 0, NEW.fair_tag)
        ON CONFLICT (tenant, type, priority) DO UPDATE
            SET last_tag = max(last_tag, excluded.last_tag);
END;
-- The cancel of the newest job in its tenant's line takes it back out (the line ends where
-- that job began): a tenant whose backlog was cancelled, newest first as a batch's cancel
-- goes, does not queue behind the work it no longer has. An older job's cancel changes
-- nothing: the tenant's newer jobs keep their tags, and its next job goes after them (FIFO).
CREATE TRIGGER IF NOT EXISTS jobs_line_cancel AFTER UPDATE OF status ON jobs
    WHEN OLD.status = 'queued' AND NEW.status = 'cancelled' AND OLD.fair_tag IS NOT NULL BEGIN
    UPDATE tenant_lines SET last_tag = OLD.fair_tag - OLD.fair_cost
        WHERE tenant = OLD.tenant AND type = OLD.type AND priority = OLD.priority
        AND last_tag = OLD.fair_tag;
END;
CREATE TRIGGER IF NOT EXISTS jobs_line_delete AFTER DELETE ON jobs
    WHEN OLD.status IN ('queued', 'processing') AND OLD.parent_id IS NULL BEGIN
    UPDATE tenant_lines SET in_flight = in_flight - 1
        WHERE tenant = OLD.tenant AND type = OLD.type AND priority = OLD.priority;
END;
-- Start-time fair queueing: the virtual clock of each ready queue, a (task type, priority): the
-- largest tag claimed from it. One per type, so workers that serve only some types do not move
-- the clock of the others (whose tenants' new jobs would then start behind old backlogs).
CREATE TABLE IF NOT EXISTS fair_clocks (
    type TEXT NOT NULL,
    priority INTEGER NOT NULL,
    clock INTEGER NOT NULL,
    PRIMARY KEY (type, priority)
) WITHOUT ROWID;
-- Each tenant's submission bucket (GCRA): its theoretical arrival time.
CREATE TABLE IF NOT EXISTS tenant_rates (tenant TEXT PRIMARY KEY, tat REAL NOT NULL)
    WITHOUT ROWID;
"""
"""Tables, indexes and triggers added to version 1 without a version bump. Created, if missing, at
every open of a version 1 file (SCHEMA includes them for a new one). Since tenants, the claim
index replaces ``jobs_queue`` (dropped on upgrade), which releases before tenants name in their
claim: a file opened by this release is not for those any more."""

_SUPERSEDED = ("jobs_queue",)
"""Indexes of version 1 that an upgrade drops (ADDED_SINCE_VERSION_1 has their successors)."""

SCHEMA = (
    """
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
    webhook_progress INTEGER NOT NULL DEFAULT 0,
    traceparent TEXT,
    tenant TEXT NOT NULL DEFAULT 'default',
    parent_id TEXT,
    fair_cost INTEGER NOT NULL DEFAULT 10000,
    fair_tag INTEGER,
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
    + ADDED_SINCE_VERSION_1
)


def _number(column: str, *, nullable: bool = False) -> str:
    # %!.17g round-trips a double exactly; json() keeps a number's text as written.
    expr = f"json(printf('%!.17g', {column}))"
    return f"iif({column} IS NULL, NULL, {expr})" if nullable else expr


def _json_text(column: str) -> str:
    return f"json({column})"


_JSON_COLUMNS = ("input", "result", "error", "usage", "metadata", "history")
"""The columns that hold JSON text. One that does not (damaged by hand or by a disk) would fail
the statement that reads it, and every claim and listing with it: the document of such a row
is ``!<column>`` instead, which row_to_job reports as unreadable."""


def valid_json(column: str) -> str:
    """SQL true unless ``column`` holds text that is not JSON (NULL is fine: json_valid of NULL
    is 0 before SQLite 3.45)."""
    return f"({column} IS NULL OR json_valid({column}))"


_JOB_OBJECT = (
    "json_object("
    + ", ".join(
        f"'{name}', {expr}"
        for name, expr in [
            ("task_id", "task_id"),
            ("type", "type"),
            ("status", "status"),
            ("priority", "priority"),
            ("input", _json_text("input")),
            ("created_at", _number("created_at")),
            ("run_at", _number("run_at")),
            ("started_at", _number("started_at", nullable=True)),
            ("finished_at", _number("finished_at", nullable=True)),
            ("attempts", "attempts"),
            ("max_attempts", "max_attempts"),
            ("fence", "fence"),
            (
                "progress",
                f"json_object('percent', {_number('progress_percent')},"
                " 'message', progress_message)",
            ),
            ("result", _json_text("result")),
            ("error", _json_text("error")),
            ("usage", _json_text("usage")),
            ("metadata", _json_text("metadata")),
            ("webhook_url", "webhook_url"),
            ("webhook_progress", "json(iif(webhook_progress, 'true', 'false'))"),
            ("traceparent", "traceparent"),
            ("tenant", "tenant"),
            ("parent_id", "parent_id"),
            ("expires_at", _number("expires_at", nullable=True)),
            ("timeout_s", _number("timeout_s", nullable=True)),
            ("deadline_at", _number("deadline_at", nullable=True)),
            ("ttl_s", _number("ttl_s")),
            ("idempotency_key", "idempotency_key"),
            ("worker_id", "worker_id"),
            ("lease_expires_at", _number("lease_expires_at", nullable=True)),
            ("history", _json_text("history")),
        ]
    )
    + ")"
)

# As bytes: a row whose text is not UTF-8 reaches pydantic-core (which reports it) instead of
# failing sqlite3's decoding of the whole statement's results.
_JOB_JSON = (
    "CAST(CASE"
    + "".join(f" WHEN NOT {valid_json(c)} THEN '!{c}'" for c in _JSON_COLUMNS)
    + f" ELSE {_JOB_OBJECT} END AS BLOB)"
)

# What every statement that hands back a job selects or returns: a few columns the backend
# needs itself, then the whole job as one JSON text that pydantic-core parses in one call.
COLUMNS = (
    "seq, task_id, event_seq, status, attempts, fence, worker_id, priority, run_at, " + _JOB_JSON
)
SEQ, TASK_ID, EVENT_SEQ, STATUS, ATTEMPTS, FENCE, WORKER_ID, PRIORITY, RUN_AT, JOB = range(10)


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    found = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return found is not None


def init_connection(conn: sqlite3.Connection, synchronous: str) -> None:
    """Pragmas and schema; fails with BackendError on a file that is not ours (left as it
    was: its journal mode was switched to WAL before it was refused)."""
    try:
        _check_ours(conn)
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA temp_store=MEMORY")
        # Checkpoints (and their fsync) run on a thread of their own, not on the writer's path.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        # The writer resets the WAL after a checkpoint; this truncates it then.
        conn.execute("PRAGMA journal_size_limit=67108864")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            # One transaction, so a second process opening the file at once sees all or none.
            conn.executescript(
                f"BEGIN IMMEDIATE;{SCHEMA}PRAGMA user_version={SCHEMA_VERSION};COMMIT;"
            )
        else:
            _upgrade_version_1(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise BackendError(f"cannot use the SQLite database: {exc}") from exc
    except BackendError:
        conn.close()
        raise


_OUR_TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA))


def _check_ours(conn: sqlite3.Connection) -> None:
    """BackendError for a file of another schema version, or one (version 0, SQLite's
    default) that holds another application's tables: it was adopted, our 12 tables added."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version not in (0, SCHEMA_VERSION):
        raise BackendError(
            f"database schema version {version} is not supported (expected {SCHEMA_VERSION})"
        )
    if version == 0:
        names = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
        }
        foreign = sorted(n for n in names - _OUR_TABLES if not n.startswith("sqlite_"))
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise BackendError(
                f"the file holds tables of another application ({shown}): not a backburner"
                " database (name a new file)"
            )


_ADDED_COLUMNS = (
    ("webhook_progress", "INTEGER NOT NULL DEFAULT 0"),
    ("traceparent", "TEXT"),
    ("tenant", "TEXT NOT NULL DEFAULT 'default'"),
    ("fair_cost", "INTEGER NOT NULL DEFAULT 10000"),
    ("fair_tag", "INTEGER"),
    ("parent_id", "TEXT"),
)
"""Columns of ``jobs`` added since version 1 (SCHEMA has them for a new file)."""

_ADDED_NAMES = frozenset(
    re.findall(r"CREATE (?:TABLE|INDEX|TRIGGER) IF NOT EXISTS (\w+)", ADDED_SINCE_VERSION_1)
)


def _statements(script: str) -> list[str]:
    """The SQL statements of ``script`` (a trigger's body holds ``;`` too)."""
    statements: list[str] = []
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                statements.append(pending)
            pending = ""
    return statements


def _up_to_date(conn: sqlite3.Connection) -> bool:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    cancel = conn.execute(
        "SELECT sql FROM sqlite_schema WHERE name = 'jobs_line_cancel'"
    ).fetchone()
    return (
        columns.issuperset(c for c, _ in _ADDED_COLUMNS)
        and names.issuperset(_ADDED_NAMES)
        and names.isdisjoint(_SUPERSEDED)
        # (a development build's jobs_line_cancel refunded any cancel, not just the newest)
        and cancel is not None
        and "last_tag = OLD.fair_tag" in cancel[0]
    )


def _upgrade_version_1(conn: sqlite3.Connection) -> None:
    """Bring a version 1 file made by an earlier release up to date: new columns, then new
    tables, indexes and triggers (IF NOT EXISTS), in one transaction, as another process may
    be doing the same."""
    if _up_to_date(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}  # under the lock
        for column, declaration in _ADDED_COLUMNS:
            if column not in columns:
                conn.execute(f"ALTER TABLE jobs ADD COLUMN {column} {declaration}")
        counted = _has_table(conn, "tenant_lines")
        messages_counted = _has_table(conn, "webhook_counts")
        for index in _SUPERSEDED:
            conn.execute(f"DROP INDEX IF EXISTS {index}")
        # Made again below from today's definitions (since children, a child is not counted).
        for trigger in (
            "jobs_line_insert",
            "jobs_line_status",
            "jobs_line_delete",
            "jobs_line_cancel",
        ):
            conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for statement in _statements(ADDED_SINCE_VERSION_1):
            conn.execute(statement)
        if not messages_counted:  # as tenant_lines below
            conn.execute(
                "UPDATE webhook_counts SET n = (SELECT count(*) FROM webhooks"
                " WHERE webhooks.status = webhook_counts.status)"
            )
        if not counted:  # its triggers keep it from now on; count what is there once
            conn.execute(
                "INSERT INTO tenant_lines (tenant, type, priority, in_flight, last_tag)"
                " SELECT tenant, type, priority, count(*), 0 FROM jobs"
                " WHERE status IN ('queued', 'processing') AND parent_id IS NULL"
                " GROUP BY tenant, type, priority"
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def row_to_job(row: tuple[Any, ...]) -> Job:
    """The Job of a row selected with COLUMNS (validated by pydantic-core from JSON); a row
    that does not parse raises CorruptRecordError with its id."""
    document = row[JOB]
    if document[:1] == b"!":
        raise CorruptRecordError(row[TASK_ID], f"{document[1:].decode()}: not JSON")
    try:
        return stored_job(document)
    except CorruptRecordError as exc:
        raise CorruptRecordError(row[TASK_ID], exc.reason) from None


def rows_to_jobs(
    rows: Sequence[tuple[Any, ...]],
) -> tuple[list[Job], list[tuple[CorruptRecordError, int]]]:
    """The Jobs of rows, and for each row that does not parse its error and fence."""
    jobs: list[Job] = []
    unreadable: list[tuple[CorruptRecordError, int]] = []
    for row in rows:
        try:
            jobs.append(row_to_job(row))
        except CorruptRecordError as exc:
            unreadable.append((exc, row[FENCE]))
    return jobs, unreadable
