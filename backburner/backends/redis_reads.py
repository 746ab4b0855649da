"""Reads of the Redis backend (a mixin of ``RedisBackend``): a job, a listing page, a job's
events, the queue's stats, a tenant's count of jobs in flight and the jobs whose leases ended.

A job is read by ``read_jobs``, which joins its hash and spec into one JSON document per job
(``read_job`` in redis_lua/prelude.lua). A listing walks the indexes, sorted sets scored by
enqueue order (``i:all``, ``i:st:<status>:<type>``, ``i:n:<tenant>``, ``i:p:<parent id>``:
docs/redis.md, "Keys"), newest first. A listing of everything, of a tenant's or a parent's
jobs, or of one status and type reads its one index; any other is one script (``list_jobs``):
a status alone merges its index of every type, a type alone its index of every status, and a
listing by several of these walks the smallest and keeps the ids all the others hold (a
parent's index is bounded by its pipeline, so a listing by parent never walks far).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CorruptRecordError
from ..models import Event, Job, JobStatus
from .base import Page, Stats, WorkerInfo, parse_cursor
from .redis_codec import decode_events, decode_job, number
from .unreadable import readable

READ_SCRIPTS = ("read_jobs", "list_jobs", "read_events", "stats")
"""The scripts of this module: they change nothing, so they are safe to send again."""

_LIST_SCAN_BUDGET = 10_000
"""Index entries one page of a listing by tenant and status or type may look at; a page that
runs out of them is shorter than asked, with a cursor to go on from."""


def _listed(documents: Sequence[Any]) -> list[Job]:
    """A listing's jobs (those that vanished, false, and those no one can read, left out)."""
    return readable([doc for doc in documents if doc], decode_job)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisReads:
    """``get``, ``list_jobs``, ``events``, ``stats``, ``tenant_in_flight``,
    ``has_open_children`` and ``expired_leases``."""

    _p: str

    if TYPE_CHECKING:

        async def _run(self, name: str, *args: str | int | float) -> Any: ...

        async def _read(self, *command: str | int | float) -> Any: ...

        async def _taken(
            self, documents: Sequence[Any], now: float, *, expired_only: bool = False
        ) -> list[Job]: ...

    async def expired_leases(self, *, now: float, limit: int) -> list[Job]:
        if limit <= 0:
            return []
        # Scores are lease ends rounded down to the second (prelude.lua lease_score; exact
        # ones, of an earlier release, too): a score below this second's is an ended lease,
        # one within it may not be. Those are few (leases ending within this second): all read.
        second = math.floor(now)
        leases = self._p + "leases"
        ids = await self._read("ZRANGEBYSCORE", leases, "-inf", f"({second}", "LIMIT", 0, limit)
        if len(ids) < limit:
            ids += await self._read("ZRANGEBYSCORE", leases, second, number(now))
        if not ids:
            return []
        ids = list(dict.fromkeys(ids))  # (a lease renewed between the two reads: once)
        # A record no one can read is failed where its lease ran out (the sweeper's place),
        # if it has: this second's leases are all read, ended or not.
        jobs = await self._taken(await self._run("read_jobs", *ids), now, expired_only=True)
        return [
            job
            for job in jobs
            if job.status == JobStatus.PROCESSING
            and job.lease_expires_at is not None
            and job.lease_expires_at <= now
        ][:limit]

    async def get(self, task_id: str) -> Job | None:
        rows = await self._run("read_jobs", task_id)
        return decode_job(rows[0]) if rows[0] else None

    async def job_status(self, task_id: str) -> JobStatus | None:
        status = await self._read("HGET", self._p + "j:" + task_id, "status")  # (JSON text)
        try:
            return None if status is None else JobStatus(text(status).strip('"'))
        except ValueError:
            raise CorruptRecordError(task_id, f"status: {text(status)[:40]!r}") from None

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        tenant: str | None = None,
        parent_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        below = parse_cursor(cursor)
        if limit <= 0:
            return Page([], None)
        # Each group is one index or a union of them (list_jobs.lua): a status and a type have
        # an index together; a status alone is its index of every type, a type alone its
        # index of every status.
        if status is not None and type is not None:
            groups = [f"=i:st:{status}:{type}"]
        elif status is not None:
            groups = [f"s{status}"]
        elif type is not None:
            groups = [f"t{type}"]
        else:
            groups = []
        if tenant is not None:
            groups.append(f"=i:n:{tenant}")
        if parent_id is not None:
            groups.append(f"=i:p:{parent_id}")
        top = "+inf" if below is None else f"({below}"
        if len(groups) > 1 or (groups and not groups[0].startswith("=")):
            found = await self._run("list_jobs", top, limit, _LIST_SCAN_BUDGET, *groups)
            return Page(_listed(found[1:]), text(found[0]) or None)
        index = groups[0][1:] if groups else "i:all"
        found = await self._read(
            "ZREVRANGEBYSCORE",
            self._p + index,
            top,
            "-inf",
            "WITHSCORES",
            "LIMIT",
            0,
            limit + 1,
        )
        ids = [text(found[i]) for i in range(0, len(found), 2)]
        seqs = [int(float(found[i])) for i in range(1, len(found), 2)]
        more = len(ids) > limit
        ids, seqs = ids[:limit], seqs[:limit]
        rows = await self._run("read_jobs", *ids) if ids else []
        return Page(_listed(rows), str(seqs[-1]) if more and seqs else None)

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        if limit <= 0:
            return []
        entries = await self._run("read_events", task_id, max(after, 0), limit)
        return decode_events(task_id, entries)

    async def tenant_in_flight(self, tenant: str) -> int:
        return int(await self._read("HGET", self._p + "inflight", tenant) or 0)

    async def has_open_children(self, parent_id: str) -> bool:
        # {bb}:open counts each parent's children queued or processing; none: no field.
        return bool(await self._read("HEXISTS", self._p + "open", parent_id))

    async def stats(self, *, now: float, worker_window_s: float = 60.0) -> Stats:
        statuses = list(JobStatus)
        counts, by_priority, workers, later = await self._run("stats", number(now), *statuses)
        count_of = {status: int(n) for status, n in zip(statuses, counts, strict=True)}
        queued = {
            int(by_priority[i]): int(by_priority[i + 1])
            for i in range(0, len(by_priority), 2)
            if int(by_priority[i + 1]) > 0
        }
        seen: list[WorkerInfo] = []
        for i in range(0, len(workers), 2):
            started, last_seen, running = text(workers[i + 1]).split(" ")
            if float(last_seen) >= now - worker_window_s:
                seen.append(
                    WorkerInfo(
                        worker_id=text(workers[i]),
                        last_seen=float(last_seen),
                        running=int(running),
                        started_at=float(started),
                    )
                )
        seen.sort(key=lambda w: w.worker_id)
        return Stats(
            count_of,
            dict(sorted(queued.items(), reverse=True)),
            count_of[JobStatus.FAILED],
            seen,
            count_of[JobStatus.QUEUED] - int(later),
        )
