"""What every benchmark job calls, whatever the queue: it records starts and completions.

A job costs the worker a lock and two additions, not a Redis round trip: each worker process
keeps a tally (completions, its first start, its latest completion, with ``time.time()`` taken
in the job) and a background flusher (a thread, a greenlet under gevent, or an asyncio task)
sends it to Redis db 8 every 10 ms:

  HSETNX peersbench:first <pid> <first start>
  HSET   peersbench:last  <pid> <latest completion>
  INCRBY peersbench:done  <completions since the last flush>

So a run's time is ``max(last) - min(first)``: first job start to last completion, as the jobs
saw them, however late the flush. A worker that forks a process per job (rq) sets
BENCH_PROBE_EAGER=1: the child sends its tally when the job ends. ``ping`` (pickup latency)
always RPUSHes its start time at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
import redis.asyncio as aredis

REDIS_URL = "redis://127.0.0.1:6379/8"
KEY_FIRST = "peersbench:first"
KEY_LAST = "peersbench:last"
KEY_DONE = "peersbench:done"
KEY_PICKUP = "peersbench:pickup"
NAP_S = 2.0
FLUSH_S = 0.01


@dataclass
class Report:
    """What one flush sends."""

    first: float | None
    last: float
    done: int


class Tally:
    """One process's starts and completions not yet sent to Redis."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: float | None = None
        self.first_seen = False
        self.last = 0.0
        self.done = 0

    def start(self, now: float) -> None:
        with self.lock:
            if not self.first_seen:
                self.first, self.first_seen = now, True

    def finish(self, now: float) -> None:
        with self.lock:
            self.done += 1
            self.last = max(self.last, now)

    def take(self) -> Report | None:
        with self.lock:
            if self.first is None and not self.done:
                return None
            report = Report(self.first, self.last, self.done)
            self.first, self.done = None, 0
            return report


def _commands(pipe: redis.client.Pipeline | aredis.client.Pipeline, report: Report) -> None:
    pid = os.getpid()
    if report.first is not None:
        pipe.hsetnx(KEY_FIRST, str(pid), repr(report.first))
    if report.done:
        pipe.hset(KEY_LAST, str(pid), repr(report.last))
        pipe.incrby(KEY_DONE, report.done)


# -- sync workers: threads, greenlets, processes -----------------------------------------------

_sync_lock = threading.Lock()
_sync: dict[int, tuple[Tally, redis.Redis]] = {}


def _sync_state() -> tuple[Tally, redis.Redis]:
    """This process's tally and client, and its flusher (a forked child makes its own)."""
    pid = os.getpid()
    with _sync_lock:
        state = _sync.get(pid)
        if state is None:
            state = _sync[pid] = (Tally(), redis.Redis.from_url(REDIS_URL))
            if not os.environ.get("BENCH_PROBE_EAGER"):
                threading.Thread(target=_flush_forever, args=state, daemon=True).start()
    return state


def _flush_sync(tally: Tally, client: redis.Redis) -> None:
    report = tally.take()
    if report is not None:
        pipe = client.pipeline(transaction=False)
        _commands(pipe, report)
        pipe.execute()


def _flush_forever(tally: Tally, client: redis.Redis) -> None:
    while True:
        time.sleep(FLUSH_S)
        try:
            _flush_sync(tally, client)
        except redis.RedisError as exc:
            print(f"probe: {exc}", file=sys.stderr)


def _finish_sync(tally: Tally, client: redis.Redis) -> None:
    tally.finish(time.time())
    if os.environ.get("BENCH_PROBE_EAGER"):
        _flush_sync(tally, client)


def noop_sync() -> None:
    tally, client = _sync_state()
    tally.start(time.time())
    _finish_sync(tally, client)


def nap_sync(sleep: Callable[[float], object] = time.sleep) -> None:
    tally, client = _sync_state()
    tally.start(time.time())
    sleep(NAP_S)
    _finish_sync(tally, client)


def ping_sync() -> None:
    _sync_state()[1].rpush(KEY_PICKUP, repr(time.time()))


# -- asyncio workers ---------------------------------------------------------------------------

_async: dict[tuple[int, int], tuple[Tally, aredis.Redis, asyncio.Task[None]]] = {}


def _async_state() -> tuple[Tally, aredis.Redis]:
    loop = asyncio.get_running_loop()
    key = (os.getpid(), id(loop))
    state = _async.get(key)
    if state is None:
        tally, client = Tally(), aredis.Redis.from_url(REDIS_URL)
        flusher = loop.create_task(_flush_forever_async(tally, client))
        state = _async[key] = (tally, client, flusher)
    return state[0], state[1]


async def _flush_forever_async(tally: Tally, client: aredis.Redis) -> None:
    while True:
        await asyncio.sleep(FLUSH_S)
        report = tally.take()
        if report is None:
            continue
        try:
            pipe = client.pipeline(transaction=False)
            _commands(pipe, report)
            await pipe.execute()
        except redis.RedisError as exc:
            print(f"probe: {exc}", file=sys.stderr)


async def noop_async() -> None:
    tally, _ = _async_state()
    now = time.time()
    tally.start(now)
    tally.finish(now)


async def nap_async() -> None:
    tally, _ = _async_state()
    tally.start(time.time())
    await asyncio.sleep(NAP_S)
    tally.finish(time.time())


async def ping_async() -> None:
    await _async_state()[1].rpush(KEY_PICKUP, repr(time.time()))
