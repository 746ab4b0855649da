"""The SQLite write-ahead log stays bounded under writes back to back."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

from backburner.backends.sqlite import SQLiteBackend
from tests.conformance._support import new_job


async def test_the_wal_starts_over_under_writes_back_to_back(tmp_path: Path) -> None:
    # A passive checkpoint never caught up with commits back to back: the log never started
    # over and grew 53 MB a second (2.5 GB for a 47 MB database in a review's 40 s run; in
    # this test, 133-152 MB in 3 s, growing at every look).
    path = str(tmp_path / "jobs.db")
    writers = [SQLiteBackend(path) for _ in range(3)]
    for writer in writers:
        await writer.connect()
        writer._executor._wal_reset_bytes = 1024 * 1024  # (64 MiB in production)
    sizes: list[int] = []
    stop = time.monotonic() + 3.0

    async def write(backend: SQLiteBackend) -> None:
        while time.monotonic() < stop:
            jobs = [new_job(payload={"x": "y" * 500}) for _ in range(50)]
            await asyncio.gather(*(backend.enqueue(job) for job in jobs))

    async def watch() -> None:
        while time.monotonic() < stop:
            sizes.append(os.path.getsize(path + "-wal"))
            await asyncio.sleep(0.02)

    try:
        await asyncio.gather(watch(), *(write(w) for w in writers))
    finally:
        for writer in writers:
            await writer.close()
    assert os.path.getsize(path) > 4 * 1024 * 1024  # (it grew past the bound meanwhile)
    peak = 0
    started_over = 0
    for size in sizes:
        if size < peak // 2:
            started_over += 1
        peak = size if size < peak // 2 else max(peak, size)
    assert started_over >= 2, sizes  # it started over, again and again
    assert max(sizes) < 64 * 1024 * 1024, max(sizes)


async def test_a_reader_that_stays_does_not_hold_the_writers(tmp_path: Path) -> None:
    # The whole checkpoint waited the busy timeout (30 s) for a reader that stayed (a backup,
    # a sqlite3 shell), holding every writer meanwhile, and tried again 50 ms later (a review:
    # 3 stalls of 5 s in 14 s with a 5 s timeout).
    path = str(tmp_path / "jobs.db")
    backend = SQLiteBackend(path)
    await backend.connect()
    backend._executor._wal_reset_bytes = 256 * 1024
    await backend.enqueue(new_job())
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM jobs").fetchone()  # a read transaction that stays
    slowest = 0.0
    largest = 0
    stop = time.monotonic() + 3.0
    try:
        while time.monotonic() < stop:
            began = time.monotonic()
            jobs = [new_job(payload={"x": "y" * 500}) for _ in range(20)]
            await asyncio.gather(*(backend.enqueue(job) for job in jobs))
            slowest = max(slowest, time.monotonic() - began)
            largest = max(largest, os.path.getsize(path + "-wal"))
    finally:
        reader.execute("COMMIT")
        reader.close()
        await backend.close()
    assert largest > 1024 * 1024  # (the log went past its bound: the reader kept it)
    assert slowest < 1.0, slowest
