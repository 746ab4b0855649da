"""A SQLite file of a release before tenants (schema version 1, without the tenant columns,
tables and indexes) is brought up to date when opened, and its jobs carry on: they belong to
the default tenant, count in flight, and queued ones are claimed in order."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from backburner.backends.base import Complete, Release
from backburner.backends.sqlite import SQLiteBackend
from backburner.errors import BackendError
from backburner.models import JobStatus
from tests.conformance._support import LEASE, T0, new_job

BEFORE_TENANTS = [
    "DROP TRIGGER jobs_line_insert",
    "DROP TRIGGER jobs_line_status",
    "DROP TRIGGER jobs_line_tag",
    "DROP TRIGGER jobs_line_cancel",
    "DROP TRIGGER jobs_line_delete",
    "DROP INDEX jobs_claim",
    "DROP INDEX jobs_waiting",
    "DROP INDEX jobs_untagged",
    "DROP INDEX jobs_tenant",
    "DROP TABLE tenant_lines",
    "DROP TABLE fair_clocks",
    "DROP TABLE tenant_rates",
    "ALTER TABLE jobs DROP COLUMN tenant",
    "ALTER TABLE jobs DROP COLUMN fair_cost",
    "ALTER TABLE jobs DROP COLUMN fair_tag",
    "ALTER TABLE jobs DROP COLUMN traceparent",
    "CREATE INDEX jobs_queue ON jobs(priority DESC, run_at, seq) WHERE status = 'queued'",
]
"""What turns a file of this release into one of the release before tenants."""


def _schema_names(path: str) -> set[str]:
    with sqlite3.connect(path) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    return names


async def test_a_file_from_before_tenants_is_upgraded_and_its_jobs_carry_on(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "old.db")
    engine = SQLiteBackend(path)
    await engine.connect()
    try:
        running, _ = await engine.enqueue(new_job(payload={"n": 0}))
        (claimed,) = await engine.claim("w1", limit=1, now=T0, lease_s=LEASE)
        first, _ = await engine.enqueue(new_job(payload={"n": 2}))
        second, _ = await engine.enqueue(new_job(payload={"n": 3}))
        later, _ = await engine.enqueue(new_job(payload={"n": 4}, run_at=T0 + 10))
    finally:
        await engine.close()
    with sqlite3.connect(path) as conn:
        for statement in BEFORE_TENANTS:
            conn.execute(statement)
        conn.execute(  # a finished job, which does not count in flight
            "INSERT INTO jobs (task_id, type, status, priority, input, fingerprint, created_at,"
            " run_at, max_attempts, metadata, ttl_s, finished_at)"
            " VALUES ('task_done', 'summarize', 'completed', 0, '{}', 'fp', ?, ?, 1, '{}', 60, ?)",
            (T0, T0, T0),
        )
    conn.close()
    assert "jobs_queue" in _schema_names(path)

    for _ in range(2):  # the second open finds the file up to date and counts nothing twice
        engine = SQLiteBackend(path)
        await engine.connect()
        try:
            assert await engine.tenant_in_flight("default") == 4
            stored = await engine.get(first.task_id)
            assert stored is not None and stored.tenant == "default"
            assert stored.traceparent is None
        finally:
            await engine.close()
    names = _schema_names(path)
    assert "jobs_queue" not in names
    assert {
        "jobs_claim",
        "jobs_untagged",
        "jobs_waiting",
        "jobs_tenant",
        "tenant_lines",
        "fair_clocks",
    } <= names

    engine = SQLiteBackend(path)
    await engine.connect()
    try:
        page = await engine.list_jobs(tenant="default", limit=10)
        assert len(page.jobs) == 5
        # Jobs queued before the upgrade have no place in a line yet: they take one, in
        # (run_at, enqueue order), at the first claim after they are due.
        await engine.finish(running.task_id, claimed.fence, Release(), now=T0 + 1)
        jobs = await engine.claim("w1", limit=10, now=T0 + 1, lease_s=LEASE)
        assert [j.task_id for j in jobs] == [first.task_id, second.task_id, running.task_id]
        (due,) = await engine.claim("w1", limit=10, now=T0 + 10, lease_s=LEASE)
        assert due.task_id == later.task_id
        assert await engine.tenant_in_flight("default") == 4
        await engine.finish(due.task_id, due.fence, Complete(None), now=T0 + 11)
        assert await engine.tenant_in_flight("default") == 3
        # New jobs mix with them, counted and ordered by tenant.
        acme, _ = await engine.enqueue(new_job(tenant="acme", now=T0 + 12))
        assert await engine.tenant_in_flight("acme") == 1
        (picked,) = await engine.claim("w1", limit=10, now=T0 + 12, lease_s=LEASE)
        assert picked.task_id == acme.task_id and picked.status == JobStatus.PROCESSING
    finally:
        await engine.close()


async def test_a_file_with_an_earlier_cancel_trigger_gets_todays(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    engine = SQLiteBackend(path)
    await engine.connect()
    await engine.close()
    with sqlite3.connect(path) as conn:  # as a development build made it: any cancel refunds
        conn.execute("DROP TRIGGER jobs_line_cancel")
        conn.execute(
            "CREATE TRIGGER jobs_line_cancel AFTER UPDATE OF status ON jobs"
            " WHEN OLD.status = 'queued' AND NEW.status = 'cancelled'"
            " AND OLD.fair_tag IS NOT NULL BEGIN"
            " UPDATE tenant_lines SET last_tag = last_tag - OLD.fair_cost"
            " WHERE tenant = OLD.tenant AND type = OLD.type AND priority = OLD.priority; END"
        )
    conn.close()
    engine = SQLiteBackend(path)
    await engine.connect()
    await engine.close()
    with sqlite3.connect(path) as conn:
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'jobs_line_cancel'"
        ).fetchone()
    conn.close()
    assert "last_tag = OLD.fair_tag" in sql


async def test_a_file_from_before_webhook_counts_counts_its_messages_once(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    engine = SQLiteBackend(path)
    await engine.connect()
    try:
        for i in range(3):
            job, _ = await engine.enqueue(new_job(webhook_url="https://example.com/hook"))
            (claimed,) = await engine.claim("w1", limit=1, now=T0 + i, lease_s=LEASE)
            await engine.finish(job.task_id, claimed.fence, Complete(i), now=T0 + i)
    finally:
        await engine.close()
    with sqlite3.connect(path) as conn:
        for trigger in ("insert", "update", "delete"):
            conn.execute(f"DROP TRIGGER webhooks_count_{trigger}")
        conn.execute("DROP TABLE webhook_counts")
    conn.close()
    for _ in range(2):  # the second open finds the file up to date and counts nothing twice
        engine = SQLiteBackend(path)
        await engine.connect()
        try:
            assert await engine.webhook_counts() == {"pending": 3, "delivered": 0, "failed": 0}
        finally:
            await engine.close()
    assert {"webhook_counts", "webhooks_count_insert"} <= _schema_names(path)


async def test_a_file_that_is_not_ours_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    # A later schema version was refused, but switched to WAL first; another application's
    # database (user_version 0, SQLite's default) was adopted, our tables added to it.
    later = str(tmp_path / "later.db")
    other = str(tmp_path / "other.db")
    with sqlite3.connect(later) as conn:
        conn.execute("CREATE TABLE jobs (task_id TEXT)")
        conn.execute("PRAGMA user_version = 2")
    conn.close()
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE customers (name TEXT)")
    conn.close()
    for path, why in ((later, "version 2 is not supported"), (other, "another application")):
        engine = SQLiteBackend(path)
        with pytest.raises(BackendError, match=why):
            await engine.connect()
        await engine.close()
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
            names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
        conn.close()
        assert names in ({"jobs"}, {"customers"})
