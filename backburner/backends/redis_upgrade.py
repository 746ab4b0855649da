"""Bring a Redis store written by an earlier release up to this release's key layout, in place.

``RedisBackend.connect`` reads one key, ``{bb}:layout``, in the same pipeline as its script
loads; when it holds ``LAYOUT_VERSION`` there is nothing to do. A store of layout 2 (before
jobs kept one listing index by status and type rather than three) takes one step, one script:
it drops the indexes by status and by type alone, which this layout makes from the one left.
Otherwise the store is new (no jobs) or of the layout before tenants (version 1, which
recorded no version), and connect runs ``upgrade_layout``: batches of
``redis_lua/upgrade.lua``, each one script, so atomic, each
converting a few hundred jobs whole and recording how far it got, until a batch records the
version. A new store takes one batch that finds nothing and records it. A store of the first
tenants release (commit 8319ca4, which recorded no version either) has jobs of this layout,
which the walk leaves alone, but one fair-share hash for all types, ``{bb}:fair``: the walk
carries it over to this layout's hash per type, ``{bb}:fair:<type>``, and the batch that
records the version deletes it (redis_lua/upgrade.lua, docs/redis.md).

There is no lock. A crash (or a lost connection) between batches leaves every job in one layout
or the other, and the next process to connect carries on from the recorded cursor. Several
processes connecting at once each run batches until one records the version; their batches
take turns in Redis and pick up where the last one stopped, so none converts a job twice.
connect() returns only once the store is up to date, so no process of this release claims,
enqueues or finishes anything while old members remain. Processes of the earlier release must
be stopped first: they would go on writing the old layout.
"""

from __future__ import annotations

import logging
import time

from ..errors import ConfigurationError
from ..jsoncodec import encode
from .base import DEFAULT_TENANT, FAIR_SCALE
from .redis_link import RedisLink
from .redis_scripts import load_script

log = logging.getLogger("backburner.redis")

LAYOUT_VERSION = 3
"""The key layout this release reads and writes (1: before tenants, which recorded none; 2:
before the listing indexes by status alone and by type alone were dropped)."""

_UPGRADABLE = (b"2",)
"""Recorded layouts ``upgrade_layout`` brings up to this one (besides none: layout 1 or new)."""

LAYOUT_KEY = "layout"
"""``{bb}:layout``: the store's layout version, written when it is new or upgraded."""

UPGRADE_BATCH = 500
"""Jobs one batch (one script) converts: a few milliseconds of Redis time."""

_PROGRESS_EVERY_S = 5.0


def check_layout(recorded: bytes | None, where: str) -> bool:
    """True if a store whose ``{bb}:layout`` holds ``recorded`` is up to date, False if it has
    no such key (new, or of layout 1) or an earlier layout and needs ``upgrade_layout``;
    ConfigurationError for any other layout (a later release's)."""
    if recorded is None or recorded in _UPGRADABLE:
        return False
    if recorded == str(LAYOUT_VERSION).encode():
        return True
    raise ConfigurationError(
        f"the Redis store {where} has key layout {recorded.decode(errors='replace')!r}, which"
        f" this release cannot read (it reads layout {LAYOUT_VERSION}); was it written by a"
        " later release?"
    )


async def upgrade_layout(
    link: RedisLink,
    prefix_key: str,
    *,
    where: str,
    batch: int = UPGRADE_BATCH,
    max_batches: int | None = None,
) -> int:
    """Run upgrade batches on the store under ``prefix_key`` (``{bb}:``) until it is up to date
    (or ``max_batches`` have run, which leaves it half-way, as a crash would). Returns how many
    jobs its own batches looked at; BackendError if Redis fails (a batch lost with its
    connection is sent once more: batches are safe to repeat)."""
    script = load_script("upgrade")
    started = last_report = time.monotonic()
    scanned = tagged = batches = 0
    while max_batches is None or batches < max_batches:
        reply = await link.run(
            script,
            (prefix_key + LAYOUT_KEY,),
            (
                prefix_key,
                LAYOUT_VERSION,
                batch,
                DEFAULT_TENANT,
                encode(DEFAULT_TENANT),
                FAIR_SCALE,
            ),
            read_only=True,  # not read-only, but safe to send again: see the module docstring
        )
        batches += 1
        scanned += int(reply[2])
        tagged += int(reply[3])
        if reply[0] == b"done":
            check_layout(reply[1], where)
            if scanned:
                log.warning(
                    "Redis %s: upgraded to key layout %d; this process looked at %d jobs and"
                    " re-queued %d ready ones in their order, in %.1f s",
                    where,
                    LAYOUT_VERSION,
                    scanned,
                    tagged,
                    time.monotonic() - started,
                )
            return scanned
        now = time.monotonic()
        if now - last_report >= _PROGRESS_EVERY_S:
            last_report = now
            log.warning(
                "Redis %s: upgrading to key layout %d: %d jobs looked at, %d ready jobs re-queued",
                where,
                LAYOUT_VERSION,
                scanned,
                tagged,
            )
    return scanned


async def mark_if_lost(link: RedisLink, prefix_key: str, *, where: str) -> bool:
    """Whether the store under ``prefix_key`` lost its keys (its layout key is gone: Redis
    restarted without persistence, or was flushed), asked once Redis has forgotten the
    scripts. A store that lost them is marked as of this layout again, as a new one is."""
    if await link.call("GET", prefix_key + LAYOUT_KEY, read_only=True) is not None:
        return False
    await upgrade_layout(link, prefix_key, where=where)
    return True
