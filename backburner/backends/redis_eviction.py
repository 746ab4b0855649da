"""Whether the Redis may evict the backend's keys, read as a backend connects, every ten minutes
after, and again once it is on another Redis (a Sentinel failover, a Cluster's MOVED, a
restart that lost the backend's code).

Redis under ``maxmemory`` with any ``maxmemory-policy`` but ``noeviction`` deletes keys to make
room, silently: a job whose keys go is neither run nor reported, which the rest of the backend
is built never to allow. A managed Redis often defaults to ``volatile-lru``. The backend warns
then, naming what the policy puts at risk (it cannot refuse: the setting may not be its
owner's to change, and with memory to spare nothing is evicted). Also read at connect: whether
as many replicas are connected as ``?replicas=N`` waits for (``check_replicas``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

from ..errors import BackendError
from .redis_link import RedisLink

log = logging.getLogger("backburner.redis")

SAFE_POLICY = "noeviction"

EVICTION_RECHECK_S = 600.0
"""How often a backend reads the policy again while connected: a managed Redis applies a
change of its parameters without a restart. A read that finds what the last one found logs
nothing."""

AT_RISK_WITH_TTL = (
    "finished jobs with their results and event logs, webhooks still to be delivered, "
    "cancel signals for running jobs, and concurrency-limit slots (the keys it gives a TTL)"
)
AT_RISK_ANY = "any job, queued and running ones included, and every index and counter"


def info_field(info: str, field: str) -> str | None:
    """A field of an ``INFO`` reply (``maxmemory_policy``), or None if it has none."""
    for line in info.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return value.strip()
    return None


def eviction_risk(policy: str) -> str | None:
    """What of the backend's data ``policy`` may evict, or None for ``noeviction``."""
    if policy == SAFE_POLICY:
        return None
    if policy.startswith("volatile-"):
        return AT_RISK_WITH_TTL
    return AT_RISK_ANY


class Eviction(NamedTuple):
    """What Redis says of eviction: its policy, and whether a maxmemory is set (without one
    nothing is evicted, whatever the policy)."""

    policy: str
    limited: bool


async def read_eviction(link: RedisLink, where: str) -> Eviction | None:
    """The eviction settings of the Redis behind ``link``, or None if it did not say (INFO may
    be denied, as by an ACL)."""
    try:
        reply = await link.call("INFO", "memory", read_only=True)
    except BackendError as exc:
        log.debug("Redis at %s: cannot read its maxmemory-policy (%s)", where, exc)
        return None
    info = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
    policy = info_field(info, "maxmemory_policy")
    if policy is None:
        return None
    return Eviction(policy, info_field(info, "maxmemory") not in ("0", None))


def report_eviction(where: str, eviction: Eviction) -> None:
    """Log a warning if ``eviction`` may evict the backend's keys (at INFO a policy that would,
    but has no maxmemory to reach)."""
    risk = eviction_risk(eviction.policy)
    if risk is None:
        return
    if not eviction.limited:
        log.info("Redis at %s: maxmemory-policy %s, but no maxmemory set", where, eviction.policy)
        return
    log.warning(
        "Redis at %s has maxmemory-policy %s: once it reaches maxmemory it deletes keys, "
        "and may delete %s. Set maxmemory-policy noeviction (a full Redis then refuses "
        "writes, and the backend reports them as errors: nothing is lost silently).",
        where,
        eviction.policy,
        risk,
    )


class EvictionWatch:
    """A backend's eviction settings as last read, reported when a read finds them changed (at
    its first read: changed from nothing)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.last: Eviction | None = None

    @property
    def policy(self) -> str | None:
        """The maxmemory-policy as last read (None: never read; INFO may be denied)."""
        return None if self.last is None else self.last.policy

    async def check(self, link: RedisLink) -> None:
        """Read the settings; report them if they changed (a failed read keeps the last)."""
        eviction = await read_eviction(link, self.where)
        if eviction is not None and eviction != self.last:
            report_eviction(self.where, eviction)
            self.last = eviction

    async def every(self, seconds: float, link: Callable[[], RedisLink | None]) -> None:
        """Check every ``seconds`` while ``link()`` gives a link (until cancelled)."""
        while True:
            await asyncio.sleep(seconds)
            current = link()
            if current is None:
                return
            await self.check(current)


async def check_replicas(link: RedisLink, where: str, wanted: int) -> None:
    """Warn if fewer replicas are connected than ``replicas=N`` waits for: then every enqueue
    waits its replica_timeout_ms and fails with NotReplicatedError (a 503), though stored, and
    a client that repeats it without an idempotency key makes the job twice."""
    if wanted <= 0:
        return
    try:
        reply = await link.call("INFO", "replication", read_only=True)
    except BackendError as exc:
        log.debug("Redis at %s: cannot read its replicas (%s)", where, exc)
        return
    info = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
    connected = info_field(info, "connected_slaves")
    if connected is not None and connected.isdigit() and int(connected) < wanted:
        log.warning(
            "Redis at %s has %s replicas connected, and replicas=%d in the URL: each enqueue "
            "waits for %d replicas, so until they connect every one is refused after "
            "replica_timeout_ms (NotReplicatedError, a 503), though stored.",
            where,
            connected,
            wanted,
            wanted,
        )
