"""One thread that owns a SQLite connection and commits concurrent operations in groups.

Every operation is a function of the connection. The thread takes all operations waiting in
its queue, runs each inside its own SAVEPOINT within one ``BEGIN IMMEDIATE`` transaction and
commits once (group commit): a thousand concurrent enqueues cost one fsync-free commit, and a
failing operation rolls back alone. Results go back to the callers' event loops in one
``call_soon_threadsafe`` per batch.

A second thread checkpoints the WAL (at most twice a second, after writes), so the fsync a
checkpoint costs never stalls the writer.

The writer thread also notices commits by other processes (``PRAGMA data_version``) and wakes
coroutines waiting in ``wait_for_change``; it polls only while someone waits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import BackburnerError, BackendError, ConfigurationError

T = TypeVar("T")

log = logging.getLogger("backburner.sqlite")

_STOP = object()
_NUDGE = object()


class _Op:
    __slots__ = ("fn", "future", "write")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        future: asyncio.Future[Any],
        write: bool,
    ) -> None:
        self.fn = fn
        self.future = future
        self.write = write


def _resolve(items: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in items:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _wrap_error(error: BaseException) -> BaseException:
    if isinstance(error, BackburnerError):
        return error
    if isinstance(error, sqlite3.Error):
        return BackendError(f"sqlite: {error}")
    return error


WAL_RESET_BYTES = 64 * 1024 * 1024
"""A write-ahead log past this size is checkpointed whole (TRUNCATE), writers held meanwhile:
under writes back to back a passive checkpoint never catches up, so the log never starts
over, and it grew 53 MB a second (1.6 GB for a 24 MB database in 30 s of streamed tokens)."""


class SQLiteExecutor:
    """Runs functions of one SQLite connection on a dedicated thread, with group commit."""

    def __init__(
        self,
        path: str,
        *,
        init: Callable[[sqlite3.Connection], None],
        busy_timeout_s: float = 30.0,
        poll_interval_s: float = 0.002,
        max_batch: int = 1024,
        wal_reset_bytes: int = WAL_RESET_BYTES,
    ) -> None:
        if not (0.0001 <= poll_interval_s <= 10):  # also refuses NaN
            raise ConfigurationError("the SQLite poll interval must be within 0.1 ms .. 10 s")
        self._path = path
        self._init = init
        self._busy_timeout_s = busy_timeout_s
        self._poll_interval_s = poll_interval_s
        self._max_batch = max_batch
        self._wal_reset_bytes = wal_reset_bytes
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._watchers: set[asyncio.Future[None]] = set()
        self._watchers_lock = threading.Lock()
        self._data_version: int | None = None
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._checkpointer: threading.Thread | None = None

    async def start(self) -> None:
        """Open the connection on the worker thread and run ``init`` (schema) there."""
        if self._thread is not None:
            return
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._thread = threading.Thread(
            target=self._main, args=(ready,), name="backburner-sqlite", daemon=True
        )
        self._thread.start()
        try:
            await ready
        except BaseException:
            self._thread.join()
            self._thread = None
            raise
        self._stopping.clear()
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, name="backburner-sqlite-checkpoint", daemon=True
        )
        self._checkpointer.start()

    async def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._thread = None
        self._queue.put(_STOP)
        self._stopping.set()
        self._dirty.set()
        await asyncio.to_thread(thread.join)
        if self._checkpointer is not None:
            await asyncio.to_thread(self._checkpointer.join)
            self._checkpointer = None

    def _checkpoint_loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_size_limit=67108864")
            # A whole checkpoint holds the writers while it waits for readers: briefly. A
            # reader that stays (a backup, a sqlite3 shell) must not hold every writer for the
            # busy timeout (30 s) at each try: it fails busy, and tries again later.
            conn.execute("PRAGMA busy_timeout=100")
            while True:
                self._dirty.wait()
                if self._stopping.is_set():
                    return
                self._dirty.clear()
                mode = "TRUNCATE" if self._wal_bytes() > self._wal_reset_bytes else "PASSIVE"
                busy = False
                try:
                    row = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
                    busy = bool(row and row[0])
                except sqlite3.Error as exc:  # busy or I/O: the next round tries again
                    busy = True
                    log.debug("checkpoint failed: %s", exc)
                # Twice a second; 20 times while the log nears its bound (writes back to back
                # grow it by tens of MB in half a second), unless a reader kept it busy.
                near = self._wal_bytes() > self._wal_reset_bytes // 2
                pause = 0.05 if near and not busy else 0.5
                if self._stopping.wait(pause):
                    return
        except sqlite3.Error as exc:
            log.warning("checkpoint thread stopped: %s", exc)
        finally:
            if conn is not None:
                conn.close()

    def _wal_bytes(self) -> int:
        try:
            return os.path.getsize(self._path + "-wal")
        except OSError:
            return 0

    async def run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        """Run ``fn(connection)`` on the thread (in a write transaction unless write=False)."""
        if self._thread is None or not self._thread.is_alive():
            raise BackendError("sqlite backend is not connected (call connect() first)")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put(_Op(fn, future, write))
        return await future

    def watch(self) -> asyncio.Future[None]:
        """A future resolved at the next commit seen by this connection (ours or another's).

        Register it before looking at the data, so a commit after the look still resolves it;
        pass it to ``unwatch`` when done.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._watchers_lock:
            self._watchers.add(future)
        self._queue.put(_NUDGE)  # the thread starts polling data_version
        return future

    def unwatch(self, future: asyncio.Future[None]) -> None:
        with self._watchers_lock:
            self._watchers.discard(future)
        future.cancel()

    def _wake_watchers(self) -> None:
        with self._watchers_lock:
            watchers = list(self._watchers)
            self._watchers.clear()
        for future in watchers:
            loop = future.get_loop()
            try:
                loop.call_soon_threadsafe(_set_none, future)
            except RuntimeError:  # that loop is closed: nobody waits any more
                pass

    def _check_foreign_commits(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._data_version = version
            self._wake_watchers()

    def _main(self, ready: asyncio.Future[None]) -> None:
        loop = ready.get_loop()
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            self._init(conn)
            self._data_version = conn.execute("PRAGMA data_version").fetchone()[0]
        except BaseException as exc:  # report any open failure to connect()'s caller
            failed: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = [
                (ready, None, _wrap_error(exc))
            ]
            loop.call_soon_threadsafe(_resolve, failed)
            return
        opened: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = [(ready, None, None)]
        loop.call_soon_threadsafe(_resolve, opened)
        try:
            self._serve(conn)
        finally:
            conn.close()

    def _serve(self, conn: sqlite3.Connection) -> None:
        while True:
            watching = bool(self._watchers)
            try:
                item = self._queue.get(timeout=self._poll_interval_s if watching else None)
            except queue.Empty:
                self._check_foreign_commits(conn)
                continue
            if item is _STOP:
                return
            ops: list[_Op] = []
            stop = False
            while True:
                if isinstance(item, _Op):
                    ops.append(item)
                elif item is _STOP:
                    stop = True
                    break
                if len(ops) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            try:
                if ops:
                    self._run_batch(conn, ops)
                self._check_foreign_commits(conn)
            except Exception as exc:  # never let the thread die: every caller would hang
                log.exception("sqlite writer: unexpected error")
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                error = BackendError(f"sqlite: {exc}")
                self._deliver([(op.future, None, error) for op in ops if not op.future.done()])
            if stop:
                return

    def _run_batch(self, conn: sqlite3.Connection, ops: list[_Op]) -> None:
        writes = any(op.write for op in ops)
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE" if writes else "BEGIN")
        except sqlite3.Error as exc:
            error = _wrap_error(exc)
            self._deliver([(op.future, None, error) for op in ops])
            return
        for op in ops:
            if writes:
                conn.execute("SAVEPOINT op")
            try:
                result = op.fn(conn)
            except BaseException as exc:  # handed to the awaiting caller
                if writes:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                outcomes.append((op.future, None, _wrap_error(exc)))
                continue
            if writes:
                conn.execute("RELEASE op")
            outcomes.append((op.future, result, None))
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            error = _wrap_error(exc)
            outcomes = [(future, None, error) for future, _, _ in outcomes]
            writes = False
        self._deliver(outcomes)
        if writes:
            self._dirty.set()
            self._wake_watchers()  # our own commits do not change data_version

    @staticmethod
    def _deliver(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for item in outcomes:
            by_loop.setdefault(item[0].get_loop(), []).append(item)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # the caller's loop is closed; nobody is waiting
                pass


def _set_none(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
