"""The distributed backend: any number of API and worker processes on many machines, one Redis.

Every transition that touches more than one key is one Lua script (``redis_lua/``), so a crash
at any instant leaves each job either before or after a transition, never in between. All keys
carry one hash tag, so every script touches a single Redis Cluster slot (docs/redis.md tells
the layout). Commands from concurrent coroutines share two pipelined connections
(``RedisLink``); waiting for work uses Pub/Sub and waiting for events XREAD BLOCK, each on a
connection of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from typing import Any, NoReturn

from ..errors import (
    BackburnerError,
    BackendError,
    ConfigurationError,
    CorruptRecordError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidTransitionError,
    JobNotFoundError,
    LeaseLostError,
    QueueFullError,
    QuotaExceededError,
    SubmitRateLimitedError,
)
from ..jsoncodec import encode
from ..models import WEBHOOK_EVENTS, Job, JobStatus, Progress
from .base import (
    CHILD_KEEP_S,
    WORKER_RETENTION_S,
    Complete,
    Fail,
    NewJob,
    NextClaim,
    Outcome,
    Quota,
    check_slot_args,
)
from .outbox import new_msg_id
from .redis_batch import ScriptBatcher
from .redis_catalog import (
    BATCHED,
    SAFE_TO_REPEAT,
    hand_off_commands,
    lacks_functions,
    load_scripts,
)
from .redis_codec import (
    NextClaimTexts,
    decode_job,
    new_job_fields,
    new_job_spec,
    number,
    priority_code,
)
from .redis_endpoint import RedisEndpoint
from .redis_eviction import EVICTION_RECHECK_S, EvictionWatch, check_replicas
from .redis_link import RedisLink
from .redis_outcomes import finished_job, outcome_args, webhook_event
from .redis_reads import RedisReads, text
from .redis_scripts import BATCH_SUFFIX
from .redis_upgrade import (
    LAYOUT_KEY,
    UPGRADE_BATCH,
    check_layout,
    mark_if_lost,
    upgrade_layout,
)
from .redis_waiting import RedisWaiting
from .redis_wake import WakeChannel
from .redis_watch import StreamWatcher
from .redis_webhooks import RedisWebhookOutbox
from .unreadable import decode_each, fail_unreadable
from .urls import connection_hint

log = logging.getLogger("backburner.redis")


def _stored(object_json: str) -> dict[str, Any]:
    """A JSON object as it reads back from the store (the empty one, most metadata, at once)."""
    return {} if object_json == "{}" else json.loads(object_json)


class RedisBackend(RedisReads, RedisWaiting, RedisWebhookOutbox):
    """Backend on Redis (``redis://host:6379/0?prefix=bb``; ``rediss://`` for TLS; the
    primary Sentinels name by ``redis+sentinel://host:26379/service/0``: backends/urls.py)."""

    upgrade_batch = UPGRADE_BATCH
    """Jobs per script when connect() upgrades a store of an earlier key layout."""

    eviction_recheck_s = EVICTION_RECHECK_S
    """How often a connected backend reads Redis's eviction policy again (a managed Redis's
    parameters may change while it runs)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "bb",
        max_queue_size: int | None = None,
        functions: bool = True,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
    ) -> None:
        """``functions``: run the scripts as Redis Functions where Redis has them (>= 7);
        False, or a Redis without them, runs them by EVALSHA (the same scripts).
        ``replicas``: an enqueue is acknowledged once this many replicas have it (``WAIT``),
        NotReplicatedError if they do not confirm it within ``replica_timeout_ms``."""
        if not prefix or any(c in prefix for c in "{}"):
            raise ConfigurationError(f"invalid Redis key prefix {prefix!r}: no braces, not empty")
        self.url = url
        self.prefix = prefix
        self.max_queue_size = max_queue_size
        self._p = "{" + prefix + "}:"
        self._tag_key = self._p + "seq"
        self._endpoint = RedisEndpoint(url, self._tag_key)
        self._where = self._endpoint.where
        self.functions = functions
        if replicas < 0 or replica_timeout_ms <= 0:
            raise ConfigurationError("replicas must be >= 0 and replica_timeout_ms > 0")
        self.replicas, self.replica_timeout_ms = replicas, replica_timeout_ms
        self._library, self._scripts = load_scripts()
        self._next_claims = NextClaimTexts()
        self._batchers = {
            name: ScriptBatcher(
                self._conn,
                self._scripts[name],
                self._scripts[name + BATCH_SUFFIX],
                (self._tag_key,),
                self._p,
                max_batch=max_batch,
                eager=eager,
                replicated=name == "enqueue",
            )
            for name, (_, max_batch, eager) in BATCHED.items()
        }
        self._pool: Any = None
        self._blocking_pool: Any = None
        self._link: RedisLink | None = None
        self._wake: WakeChannel | None = None
        self._watcher: StreamWatcher | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()
        """Reconnections after a Cluster's MOVED, checks of the store after a restart, and
        the eviction policy's re-reads: cancelled by close()."""
        self._store_check: asyncio.Task[None] | None = None
        self._eviction = EvictionWatch(self._where)

    # -- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> None:
        if self._wake is not None:
            return
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:  # a second caller waits until the store is up to date
            if self._wake is None:
                await self._connect()

    async def _connect(self) -> None:
        options: dict[str, Any] = {
            "socket_connect_timeout": 5.0,
            "socket_timeout": 5.0,  # a Redis that stops answering is an error after 5 s
            "health_check_interval": 0,
            "protocol": 2,  # the replies this module parses are RESP2 shapes
        }
        self._pool = self._endpoint.pool(**options)
        self._blocking_pool = self._endpoint.pool(**options)
        self._link = RedisLink(
            self._pool,
            where=self._where,
            replicas=self.replicas,
            replica_timeout_ms=self.replica_timeout_ms,
            hands_off=hand_off_commands(self._scripts),
        )
        self._link.on_moved = self._slot_moved
        self._link.start()
        where = f"{self._where} (prefix {self.prefix!r})"
        try:
            layout, _, _, _, _ = await asyncio.gather(
                self._link.call("GET", self._p + LAYOUT_KEY, read_only=True),
                self._load_code(self._link),
                self._eviction.check(self._link),
                self._check_channels(self._link),
                check_replicas(self._link, self._where, self.replicas),
            )
            if not check_layout(layout, where):
                # A new store, or one of an earlier layout: returns once up to date.
                await upgrade_layout(self._link, self._p, where=where, batch=self.upgrade_batch)
            # From now on a script Redis does not know means it restarted (the upgrade's own
            # script is loaded at first use).
            self._link.on_code_lost = self._code_lost
        except BackendError as exc:
            await self.close()
            message = str(exc)
            if not message.startswith("Redis at "):  # (a refusal: it says no more of where)
                message = f"Redis at {self._where}: {message}"
            if "NOAUTH" in message:
                message += " Give its password in the URL, as [user]:PASSWORD@ before the host."
            message += connection_hint(self.url, message)
            raise BackendError(f"cannot connect to {message}") from None
        except BaseException:
            await self.close()
            raise
        self._wake = WakeChannel(self._blocking_pool, self._p + "wake", where=self._where)
        self._watcher = StreamWatcher(self._blocking_pool, self._link, self._p, where=self._where)
        self._endpoint.watch_failovers(self._primary_moved)
        self._on_the_side(self._eviction.every(self.eviction_recheck_s, lambda: self._link))

    async def _primary_moved(self, reason: str) -> None:
        """A failover: every connection is dropped, so each opens again on the new primary."""
        log.warning("Redis at %s: %s; reconnecting", self._where, reason)
        if self._link is not None:
            await self._link.reconnect(reason)
        await self._reconnect_readers()
        self._recheck_eviction()

    def _slot_moved(self, reply: str) -> bool:
        """A Cluster node answered MOVED: the link reconnects (to the node it names); so do
        the blocking readers, whose connections are to the old node too."""
        if not self._endpoint.redirected(reply):
            return False
        log.warning("Redis at %s: %s; reconnecting", self._where, reply)
        self._on_the_side(self._reconnect_readers())
        self._recheck_eviction()
        return True

    def _recheck_eviction(self) -> None:
        """Another Redis (a failover, a moved slot) may have another eviction policy: read it,
        on the side (the Sentinel watch or the reply being handled goes on meanwhile)."""
        if self._link is not None:
            self._on_the_side(self._eviction.check(self._link))

    def _code_lost(self) -> None:
        """Redis no longer knew the scripts: whether it lost the keys too is asked once (the
        scripts that found out at once all call this)."""
        if self._store_check is None or self._store_check.done():
            self._store_check = self._on_the_side(self._check_store())

    async def _taken(
        self, documents: Sequence[Any], now: float, *, expired_only: bool = False
    ) -> list[Job]:
        """The jobs of documents a claim took for this worker; those that cannot be read are
        failed (corrupt_record), not returned: one must not stop the worker. ``expired_only``:
        the documents are of leases found ended (the sweeper's), and only those are failed."""
        jobs, unreadable = decode_each([doc for doc in documents if doc], decode_job)
        for exc in unreadable:
            await self._fail_unreadable(exc, now, expired_only=expired_only)
        return jobs

    def _taken_one(self, document: bytes, now: float) -> Job | None:
        """``_taken`` of one document, for a callback: an unreadable one is failed aside."""
        try:
            return decode_job(document)
        except CorruptRecordError as exc:
            self._on_the_side(self._fail_unreadable(exc, now))
            return None

    async def _fail_unreadable(
        self, exc: CorruptRecordError, now: float, *, expired_only: bool = False
    ) -> None:
        """Fail a job this worker holds (or whose lease ended) whose record cannot be read,
        under the fence its hash holds (the document that told its id did not parse)."""
        fence = None
        if exc.task_id is not None:
            try:
                held = await self._read("HGET", self._p + "j:" + exc.task_id, "fence")
            except BackburnerError as failed:
                log.error("%s; its fence could not be read (%s)", exc, failed)
                return
            fence = int(held) if held is not None and held.isdigit() else None
        await fail_unreadable(self, exc, fence, now=now, expired_only=expired_only)

    def _on_the_side(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task of its own, which close() cancels."""
        task = asyncio.get_running_loop().create_task(work)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def _check_store(self) -> None:
        try:
            link = self._conn()
            lost = await mark_if_lost(link, self._p, where=self._where)
        except BackendError as exc:  # (Redis went away again: the next script asks again)
            log.info("Redis at %s: could not check the store after a restart: %s", self._where, exc)
            return
        if lost:
            log.error(
                "Redis at %s has lost every key of prefix %r: it restarted without persistence, "
                "or was flushed. The jobs queued or running before are gone, with their events "
                "and webhooks; what is enqueued from now on is kept. For Redis to keep them "
                "through a restart: appendonly yes (docs/redis.md, Durability).",
                self._where,
                self.prefix,
            )
        # A restarted Redis may have come back with another configuration.
        await self._eviction.check(link)

    @property
    def eviction_policy(self) -> str | None:
        """Redis's maxmemory-policy as last read (None: never read; INFO may be denied)."""
        return self._eviction.policy

    async def _reconnect_readers(self) -> None:
        for reader in (self._wake, self._watcher):
            if reader is not None:
                await reader.reconnect()

    async def _check_channels(self, link: RedisLink) -> None:
        """Refuse, at connect, a user that may not use the prefix's channels: the scripts
        publish their wake-ups and hand-offs after their writes, so each enqueue was stored
        and then failed (a 503 for a job that ran), and no worker was woken. (Redis 7 gives a
        new ACL user no channels: acl-pubsub-default resetchannels.)"""
        for channel in (self._p + "wake", self._p + "hand:-"):  # ("-": no worker's inbox)
            try:
                await link.call("PUBLISH", channel, "")
            except BackendError as exc:
                if "NOPERM" not in str(exc):
                    raise
                raise BackendError(
                    f"Redis at {self._where}: this user may not publish to the channel"
                    f" {channel!r}. backburner needs the channels under its prefix as well as"
                    f" its keys: ACL SETUSER <user> &{self._p}* (or allchannels)."
                ) from None

    async def _load_code(self, link: RedisLink) -> None:
        """Load the library (and call its functions from now on) or, failing that, the
        scripts: a call then never waits for its code to load, but after a Redis restart."""
        if self.functions:
            try:
                await link.load_library(self._library.source)
                link.functions = True
                return
            except BackendError as exc:
                if not lacks_functions(exc):
                    raise
                log.info(
                    "Redis at %s has no Redis Functions (%s): scripts by EVALSHA", link.where, exc
                )
        await asyncio.gather(
            *(link.call("SCRIPT", "LOAD", s.source) for s in self._scripts.values())
        )

    async def close(self) -> None:
        await self._endpoint.close()  # (first: no failover starts reconnecting what closes)
        side_tasks = list(self._side_tasks)
        for task in side_tasks:
            task.cancel()
        if side_tasks:
            await asyncio.wait(side_tasks, timeout=2.0)
        link, self._link = self._link, None
        wake, self._wake = self._wake, None
        if wake is not None:
            await wake.close()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.close()
        if link is not None:
            await link.close()
        if self._blocking_pool is not None:
            await self._blocking_pool.disconnect()
            self._blocking_pool = None
        if self._pool is not None:
            await self._pool.disconnect()
            self._pool = None

    def _conn(self) -> RedisLink:
        if self._link is None:
            raise BackendError("the Redis backend is not connected (call connect() first)")
        return self._link

    async def _run(self, name: str, *args: str | int | float) -> Any:
        return await self._conn().run(
            self._scripts[name],
            (self._tag_key,),
            (self._p, *args),
            read_only=name in SAFE_TO_REPEAT,
        )

    def _run_batched(self, name: str, *args: str | int | float) -> Awaitable[Any]:
        """Like _run, in one Redis call with the other calls of this loop turn."""
        return self._batchers[name].call(args)

    async def _read(self, *command: str | int | float) -> Any:
        return await self._conn().call(*command, read_only=True)

    # -- producers ---------------------------------------------------------------------------

    async def enqueue(self, job: NewJob, *, quota: Quota | None = None) -> tuple[Job, bool]:
        input_json = encode(job.input, "input")
        metadata_json = encode(job.metadata, "metadata")
        max_in_flight = per_minute = None
        if quota is not None:
            max_in_flight, per_minute = quota.max_in_flight, quota.per_minute
        created_at, ttl_s = number(job.created_at), number(job.ttl_s)
        # (A job due at once is due at its creation: one float's text, not two.)
        run_at = created_at if job.run_at == job.created_at else number(job.run_at)
        reply = await self._run_batched(
            "enqueue",
            job.task_id,
            job.type,
            new_job_spec(job, input_json, metadata_json, created_at, ttl_s),
            job.fingerprint[:32],  # 128 bits tell requests apart; short keeps the hash compact
            job.idempotency_key or "",
            "" if self.max_queue_size is None else self.max_queue_size,
            priority_code(job.priority),
            run_at,
            "1" if job.run_at > job.created_at else "0",
            created_at,
            job.priority,
            job.tenant,
            job.fair_cost,
            "" if max_in_flight is None else max_in_flight,
            "" if per_minute is None else per_minute,
            job.parent_id or "",
            *new_job_fields(job, run_at, ttl_s),
        )
        status = reply[0]
        if status == b"exists":
            raise BackendError(f"a job with id {job.task_id} already exists")
        if status == b"conflict":
            assert job.idempotency_key is not None
            raise IdempotencyConflictError(job.idempotency_key, text(reply[1]))
        if status == b"duplicate":
            return decode_job(reply[1]), False
        if status == b"full":
            raise QueueFullError(
                f"the queue holds {reply[1]} jobs, its limit (max_queue_size) is "
                f"{self.max_queue_size}"
            )
        if status == b"quota":
            assert max_in_flight is not None
            raise QuotaExceededError(job.tenant, max_in_flight)
        if status == b"rate":
            assert per_minute is not None
            raise SubmitRateLimitedError(job.tenant, per_minute, retry_after=float(reply[1]))
        return job.to_job(input=_stored(input_json), metadata=_stored(metadata_json)), True

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
        rows = await self._run(
            "claim",
            worker_id,
            encode(worker_id),
            number(now),
            number(now + lease_s),
            limit,
            *(types or ()),
        )
        return await self._taken(rows, now)

    async def heartbeat(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lease_s: float
    ) -> dict[str, int]:
        pairs: list[str | int] = []
        for task_id, fence in held.items():
            pairs += (task_id, fence)
        renewed = await self._run(
            "heartbeat", worker_id, encode(worker_id), number(now), number(now + lease_s), *pairs
        )
        return {text(renewed[i]): int(renewed[i + 1]) for i in range(0, len(renewed), 2)}

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
            encoded = encode(data, "data")
        except InvalidInputError as exc:
            await self._raise_unless_held(task_id, fence, exc)
        extra: list[str] = []
        if progress is not None:
            extra.append(number(progress.percent))
            if progress.message is not None:
                extra.append(encode(progress.message))
        reply = await self._run("append_event", task_id, fence, type, encoded, number(now), *extra)
        if reply[0] != b"ok":
            raise LeaseLostError(task_id, fence)
        return int(reply[1])

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
        try:
            details = outcome_args(outcome, now)
        except InvalidInputError as exc:
            await self._raise_unless_held(task_id, fence, exc)
        # A terminal outcome of the claim `claimed` shows is built from it, not read back: the
        # script's read of the job (its spec and whole hash) is a fifth of its Redis time.
        if not (
            isinstance(outcome, Complete | Fail)
            and claimed is not None
            and (claimed.task_id, claimed.fence, claimed.status)
            == (task_id, fence, JobStatus.PROCESSING)
        ):
            claimed = None
        reply = await self._run_batched(
            "finish",
            task_id,
            fence,
            number(now),
            "1" if only_if_lease_expired else "0",
            # The webhook message's id, if this makes a job with one terminal (a claimed job
            # shows whether it has one: no id to make for the many that do not).
            "" if claimed is not None and claimed.webhook_url is None else new_msg_id(),
            webhook_event(outcome),
            "1" if claimed is None else "0",
            "" if then_claim is None else self._next_claims.text(then_claim),
            *details,
        )
        if reply[0] != b"ok":
            raise LeaseLostError(task_id, fence)
        if then_claim is not None and reply[-1]:
            then_claim.jobs.extend(await self._taken(reply[-1], now))
        if claimed is None:
            return decode_job(reply[1])
        assert isinstance(outcome, Complete | Fail)
        return finished_job(claimed, outcome, details, float(now), reply)

    async def _raise_unless_held(self, task_id: str, fence: int, error: Exception) -> NoReturn:
        """A stale writer hears about its lease first, whatever else is wrong with its write."""
        status, current = await self._read("HMGET", self._p + "j:" + task_id, "status", "fence")
        if status != b'"processing"' or current != str(fence).encode():
            raise LeaseLostError(task_id, fence)
        raise error

    async def cancel(self, task_id: str, *, now: float) -> tuple[Job, bool]:
        reply = await self._run(
            "cancel", task_id, number(now), new_msg_id(), WEBHOOK_EVENTS[JobStatus.CANCELLED]
        )
        if reply[0] == b"missing":
            raise JobNotFoundError(task_id)
        return decode_job(reply[1]), reply[0] == b"ok"

    async def poll_cancellations(self, worker_id: str) -> dict[str, int]:
        flat = await self._run("poll_cancellations", worker_id)
        return {text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

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
        limit = None if quota is None else quota.max_in_flight
        reply = await self._run(
            "replay",
            task_id,
            number(now),
            extra_attempts,
            "" if limit is None else limit,
            "1" if cancelled_too else "0",
        )
        if reply[0] == b"quota":
            assert limit is not None
            raise QuotaExceededError(text(reply[1]), limit)
        if reply[0] == b"missing":
            raise JobNotFoundError(task_id)
        if reply[0] == b"invalid":
            raise InvalidTransitionError(
                f"only failed jobs can be replayed; job {task_id} is {text(reply[1])}"
            )
        return decode_job(reply[1])

    async def wake(self, task_id: str, *, now: float) -> bool:
        # Publishes on {bb}:wake like an enqueue when it moves the job, so idle workers claim it.
        return bool(await self._run("wake", task_id, number(now)))

    async def delete(self, task_id: str) -> bool:
        reply = await self._run("delete", task_id)
        if reply[0] == b"missing":
            return False
        if reply[0] == b"invalid":
            raise InvalidTransitionError(
                f"job {task_id} is {text(reply[1])}; only terminal jobs can be deleted"
                " (cancel it first)"
            )
        return True

    # -- sweeper -----------------------------------------------------------------------------

    async def purge_expired(self, *, now: float, limit: int) -> int:
        if limit <= 0:
            return 0
        forget_before = number(now - WORKER_RETENTION_S)
        purged = await self._run(
            "purge_expired", number(now), limit, forget_before, number(CHILD_KEEP_S)
        )
        return int(purged)

    async def wait_for_events(self, after: Mapping[str, int], *, timeout: float) -> dict[str, int]:
        if not after:
            await asyncio.sleep(timeout)
            return {}
        ids = list(after)
        heads = await self._run("watch_heads", *ids)
        grown = {
            task_id: int(head or 0)
            for task_id, head in zip(ids, heads, strict=True)
            if head is None or int(head) > after[task_id]
        }
        if grown or timeout <= 0:
            return grown
        if self._watcher is None:
            raise BackendError("the Redis backend is closed")
        return await self._watcher.wait(after, timeout)

    # -- concurrency slots: a sorted set {bb}:slot:<key> of holder -> lease end --------------

    async def acquire_slot(
        self, key: str, holder: str, *, limit: int, lease_s: float, now: float
    ) -> bool:
        check_slot_args(key, holder, limit=limit, lease_s=lease_s)
        reply = await self._run(
            "slot_acquire", key, holder, limit, number(now), number(now + lease_s)
        )
        return bool(reply)

    async def renew_slot(self, key: str, holder: str, *, lease_s: float, now: float) -> bool:
        check_slot_args(key, holder, lease_s=lease_s)
        reply = await self._run("slot_renew", key, holder, number(now), number(now + lease_s))
        return bool(reply)

    async def release_slot(self, key: str, holder: str) -> None:
        check_slot_args(key, holder)
        # One command, so atomic; sent again if the connection breaks (a repeat does nothing).
        await self._conn().call("ZREM", self._p + "slot:" + key, holder, read_only=True)

    async def slots_in_use(self, key: str, *, now: float) -> int:
        check_slot_args(key)
        return int(await self._read("ZCOUNT", self._p + "slot:" + key, f"({number(now)}", "+inf"))


async def delete_all_keys(url: str, prefix: str) -> int:
    """Delete every key of the deployment under ``prefix``: all its jobs, irreversibly.

    For tests and benchmarks, which each use a prefix of their own; returns how many keys."""
    from redis.asyncio import Redis

    endpoint = RedisEndpoint(url, "{" + prefix + "}:seq")
    pool = endpoint.pool()
    client = Redis(connection_pool=pool)
    deleted = 0
    try:
        keys = [k async for k in client.scan_iter(match=f"{{{prefix}}}:*", count=5000)]
        for start in range(0, len(keys), 1000):
            deleted += await client.delete(*keys[start : start + 1000])
    finally:
        await client.aclose()
        await pool.disconnect()
        await endpoint.close()
    return deleted
