"""Concurrency slots: a counting semaphore with leases, shared by every process on the store.

Times are explicit ``now`` values (backends never read the clock): a lease taken at T0 for
LEASE seconds is live while now < T0 + LEASE and ended from T0 + LEASE on.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from backburner.backends import Backend
from backburner.backends.sqlite import SQLiteBackend
from backburner.errors import InvalidInputError

from ._support import T0, peer

LEASE = 10.0
KEY = "model:gpt-x"


async def acquire(backend: Backend, holder: str, *, limit: int = 2, now: float = T0) -> bool:
    return await backend.acquire_slot(KEY, holder, limit=limit, lease_s=LEASE, now=now)


async def test_acquire_up_to_the_limit_then_refuse(backend: Backend) -> None:
    assert await backend.slots_in_use(KEY, now=T0) == 0
    assert await acquire(backend, "a", limit=3) is True
    assert await acquire(backend, "b", limit=3) is True
    assert await acquire(backend, "c", limit=3) is True
    assert await backend.slots_in_use(KEY, now=T0) == 3
    assert await acquire(backend, "d", limit=3) is False
    assert await acquire(backend, "e", limit=3, now=T0 + LEASE - 0.001) is False
    assert await backend.slots_in_use(KEY, now=T0) == 3


async def test_release_frees_a_slot_for_another_holder(backend: Backend) -> None:
    assert await acquire(backend, "a", limit=1) is True
    assert await acquire(backend, "b", limit=1) is False
    await backend.release_slot(KEY, "a")
    assert await backend.slots_in_use(KEY, now=T0) == 0
    assert await acquire(backend, "b", limit=1) is True
    assert await acquire(backend, "a", limit=1) is False
    assert await backend.slots_in_use(KEY, now=T0) == 1


async def test_acquire_again_keeps_the_one_slot_and_extends_its_lease(backend: Backend) -> None:
    assert await acquire(backend, "a", limit=2) is True
    assert await acquire(backend, "a", limit=2) is True
    assert await backend.slots_in_use(KEY, now=T0) == 1
    assert await acquire(backend, "b", limit=2) is True  # a holds one slot, not two
    assert await acquire(backend, "c", limit=2) is False
    # a's lease now runs to T0 + 5 + LEASE; b's ends at T0 + LEASE.
    assert await acquire(backend, "a", limit=2, now=T0 + 5) is True
    assert await backend.slots_in_use(KEY, now=T0 + LEASE) == 1
    assert await acquire(backend, "c", limit=2, now=T0 + LEASE) is True  # b's slot
    assert await acquire(backend, "d", limit=2, now=T0 + LEASE) is False  # a still holds one
    assert await backend.slots_in_use(KEY, now=T0 + 5 + LEASE - 0.001) == 2
    assert await backend.slots_in_use(KEY, now=T0 + 5 + LEASE) == 1


async def test_an_acquire_reclaims_slots_whose_lease_ended(backend: Backend) -> None:
    assert await acquire(backend, "a") is True
    assert await acquire(backend, "b") is True
    assert await acquire(backend, "c", now=T0 + LEASE - 0.001) is False
    # A lease ends at expires_at itself: both slots are free at T0 + LEASE.
    assert await acquire(backend, "c", now=T0 + LEASE) is True
    assert await acquire(backend, "d", now=T0 + LEASE) is True
    assert await acquire(backend, "e", now=T0 + LEASE) is False
    assert await backend.slots_in_use(KEY, now=T0 + LEASE) == 2
    # The dead holders lost their slots for good; acquiring again is a new request.
    assert await backend.renew_slot(KEY, "a", lease_s=LEASE, now=T0 + LEASE) is False
    assert await acquire(backend, "a", now=T0 + LEASE) is False
    assert await acquire(backend, "a", now=T0 + 2 * LEASE) is True


async def test_a_holder_whose_lease_ended_may_acquire_again_if_a_slot_is_free(
    backend: Backend,
) -> None:
    assert await acquire(backend, "a", limit=1) is True
    assert await acquire(backend, "a", limit=1, now=T0 + 3 * LEASE) is True
    assert await backend.slots_in_use(KEY, now=T0 + 3 * LEASE) == 1
    assert await acquire(backend, "b", limit=1, now=T0 + 3 * LEASE) is False


async def test_renew_extends_a_live_lease(backend: Backend) -> None:
    assert await acquire(backend, "a", limit=1) is True
    assert await backend.renew_slot(KEY, "a", lease_s=LEASE, now=T0 + 8) is True
    assert await backend.renew_slot(KEY, "a", lease_s=LEASE, now=T0 + 8) is True  # repeatable
    # Past the first lease, the holder still has its slot: it ends at T0 + 8 + LEASE.
    assert await backend.slots_in_use(KEY, now=T0 + LEASE + 1) == 1
    assert await acquire(backend, "b", limit=1, now=T0 + LEASE + 1) is False
    assert await backend.renew_slot(KEY, "a", lease_s=LEASE, now=T0 + 8 + LEASE - 0.5) is True
    assert await backend.slots_in_use(KEY, now=T0 + 8 + 2 * LEASE - 0.501) == 1
    assert await backend.slots_in_use(KEY, now=T0 + 8 + 2 * LEASE - 0.5) == 0


async def test_renew_after_the_lease_ended_is_refused_and_brings_nothing_back(
    backend: Backend,
) -> None:
    assert await acquire(backend, "a", limit=1) is True
    assert await backend.renew_slot(KEY, "a", lease_s=LEASE, now=T0 + LEASE) is False
    assert await backend.slots_in_use(KEY, now=T0 + LEASE) == 0
    assert await acquire(backend, "b", limit=1, now=T0 + LEASE) is True
    # Its slot was taken since: still refused, and b keeps the slot.
    assert await backend.renew_slot(KEY, "a", lease_s=LEASE, now=T0 + LEASE + 1) is False
    assert await backend.slots_in_use(KEY, now=T0 + LEASE + 1) == 1
    assert await backend.renew_slot(KEY, "b", lease_s=LEASE, now=T0 + LEASE + 1) is True


async def test_renew_of_a_slot_never_held_is_refused(backend: Backend) -> None:
    assert await backend.renew_slot(KEY, "nobody", lease_s=LEASE, now=T0) is False
    assert await acquire(backend, "a") is True
    assert await backend.renew_slot(KEY, "nobody", lease_s=LEASE, now=T0) is False
    assert await backend.renew_slot("other-key", "a", lease_s=LEASE, now=T0) is False
    assert await backend.slots_in_use(KEY, now=T0) == 1


async def test_release_is_idempotent_and_touches_only_its_holder(backend: Backend) -> None:
    await backend.release_slot(KEY, "a")  # never held, never existed
    assert await acquire(backend, "a") is True
    assert await acquire(backend, "b") is True
    await backend.release_slot(KEY, "a")
    await backend.release_slot(KEY, "a")
    await backend.release_slot(KEY, "nobody")
    assert await backend.slots_in_use(KEY, now=T0) == 1
    assert await backend.renew_slot(KEY, "b", lease_s=LEASE, now=T0) is True
    assert await backend.renew_slot(KEY, "a", lease_s=LEASE, now=T0) is False
    # Releasing after the lease ended is harmless too.
    await backend.release_slot(KEY, "b")
    await backend.release_slot(KEY, "b")
    assert await backend.slots_in_use(KEY, now=T0) == 0


async def test_slots_in_use_counts_only_live_holders(backend: Backend) -> None:
    assert await backend.acquire_slot(KEY, "a", limit=5, lease_s=5, now=T0) is True
    assert await backend.acquire_slot(KEY, "b", limit=5, lease_s=10, now=T0) is True
    assert await backend.acquire_slot(KEY, "c", limit=5, lease_s=20, now=T0) is True
    assert await backend.slots_in_use(KEY, now=T0) == 3
    assert await backend.slots_in_use(KEY, now=T0 + 4.999) == 3
    assert await backend.slots_in_use(KEY, now=T0 + 5) == 2
    assert await backend.slots_in_use(KEY, now=T0 + 10) == 1
    assert await backend.slots_in_use(KEY, now=T0 + 20) == 0
    # A pure read: looking at a later time removed nobody.
    assert await backend.slots_in_use(KEY, now=T0) == 3
    assert await backend.slots_in_use("never-used", now=T0) == 0


async def test_keys_are_independent(backend: Backend) -> None:
    assert await backend.acquire_slot("m1", "a", limit=1, lease_s=LEASE, now=T0) is True
    assert await backend.acquire_slot("m2", "a", limit=1, lease_s=LEASE, now=T0) is True
    assert await backend.acquire_slot("m2", "b", limit=1, lease_s=LEASE, now=T0) is False
    assert await backend.acquire_slot("m3", "b", limit=1, lease_s=LEASE, now=T0) is True
    await backend.release_slot("m1", "a")
    assert await backend.slots_in_use("m1", now=T0) == 0
    assert await backend.slots_in_use("m2", now=T0) == 1
    assert await backend.slots_in_use("m3", now=T0) == 1
    assert await backend.renew_slot("m2", "a", lease_s=LEASE, now=T0) is True
    assert await backend.renew_slot("m1", "a", lease_s=LEASE, now=T0) is False


async def test_a_lowered_limit_refuses_newcomers_until_enough_holders_leave(
    backend: Backend,
) -> None:
    for holder in "abc":
        assert await acquire(backend, holder, limit=3) is True
    assert await acquire(backend, "d", limit=2) is False
    # A holder keeps the slot it has, even above the new limit.
    assert await acquire(backend, "a", limit=2) is True
    assert await acquire(backend, "a", limit=1) is True
    assert await backend.slots_in_use(KEY, now=T0) == 3
    await backend.release_slot(KEY, "c")
    assert await acquire(backend, "d", limit=2) is False
    await backend.release_slot(KEY, "b")
    assert await acquire(backend, "d", limit=2) is True
    assert await acquire(backend, "e", limit=2) is False
    assert await backend.slots_in_use(KEY, now=T0) == 2


BAD_ACQUIRES: list[dict[str, Any]] = [
    {"limit": 0},
    {"limit": -1},
    {"limit": True},
    {"limit": 2.0},
    {"lease_s": 0},
    {"lease_s": -1.0},
    {"lease_s": math.nan},
    {"lease_s": math.inf},
    {"key": ""},
    {"holder": ""},
]


@pytest.mark.parametrize("bad", BAD_ACQUIRES, ids=repr)
async def test_bad_acquire_arguments_are_refused(backend: Backend, bad: dict[str, Any]) -> None:
    assert await acquire(backend, "a", limit=1) is True
    args: dict[str, Any] = {"key": KEY, "holder": "b", "limit": 5, "lease_s": LEASE, "now": T0}
    args.update(bad)
    with pytest.raises(InvalidInputError):
        await backend.acquire_slot(**args)
    assert await backend.slots_in_use(KEY, now=T0) == 1
    assert await backend.renew_slot(KEY, "b", lease_s=LEASE, now=T0) is False


@pytest.mark.parametrize("lease_s", [0, -5.0, math.nan, math.inf])
async def test_bad_renew_arguments_are_refused(backend: Backend, lease_s: float) -> None:
    assert await acquire(backend, "a", limit=1) is True
    with pytest.raises(InvalidInputError):
        await backend.renew_slot(KEY, "a", lease_s=lease_s, now=T0 + 1)
    # Nothing changed: the lease still ends at T0 + LEASE.
    assert await backend.slots_in_use(KEY, now=T0 + LEASE - 0.001) == 1
    assert await backend.slots_in_use(KEY, now=T0 + LEASE) == 0


async def test_empty_key_or_holder_is_refused_everywhere(backend: Backend) -> None:
    with pytest.raises(InvalidInputError):
        await backend.renew_slot("", "a", lease_s=LEASE, now=T0)
    with pytest.raises(InvalidInputError):
        await backend.renew_slot(KEY, "", lease_s=LEASE, now=T0)
    with pytest.raises(InvalidInputError):
        await backend.release_slot("", "a")
    with pytest.raises(InvalidInputError):
        await backend.release_slot(KEY, "")
    with pytest.raises(InvalidInputError):
        await backend.slots_in_use("", now=T0)


@pytest.mark.parametrize("connections", ["one-connection", "two-connections"])
async def test_concurrent_acquirers_never_exceed_the_limit(
    backend: Backend, connections: str
) -> None:
    async with peer(backend) as other:
        second = other if connections == "two-connections" else backend
        results = await asyncio.gather(
            *(
                (backend if i % 2 == 0 else second).acquire_slot(
                    KEY, f"h{i}", limit=3, lease_s=LEASE, now=T0
                )
                for i in range(20)
            )
        )
        assert results.count(True) == 3, results
        assert await backend.slots_in_use(KEY, now=T0) == 3
        assert await second.slots_in_use(KEY, now=T0) == 3
        winners = [f"h{i}" for i, won in enumerate(results) if won]
        # Each winner holds its slot, as seen from either connection; the losers hold none.
        for i in range(20):
            held = f"h{i}" in winners
            renewer = backend if i % 2 else second
            assert await renewer.renew_slot(KEY, f"h{i}", lease_s=LEASE, now=T0) is held

        # Releases and acquires racing: the limit still holds at every step.
        released = winners[:2]
        newcomers = [f"n{i}" for i in range(10)]
        outcomes = await asyncio.gather(
            *(backend.release_slot(KEY, h) for h in released),
            *(
                (second if i % 2 else backend).acquire_slot(KEY, h, limit=3, lease_s=LEASE, now=T0)
                for i, h in enumerate(newcomers)
            ),
        )
        taken = outcomes[len(released) :].count(True)
        assert taken <= 2
        assert await backend.slots_in_use(KEY, now=T0) == 1 + taken


async def test_sqlite_two_backends_on_one_file_share_the_slots(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    first, second = SQLiteBackend(path), SQLiteBackend(path)
    await first.connect()
    await second.connect()
    try:
        assert await first.acquire_slot(KEY, "a", limit=2, lease_s=LEASE, now=T0) is True
        assert await second.acquire_slot(KEY, "b", limit=2, lease_s=LEASE, now=T0) is True
        assert await second.acquire_slot(KEY, "c", limit=2, lease_s=LEASE, now=T0) is False
        assert await second.slots_in_use(KEY, now=T0) == 2
        await second.release_slot(KEY, "a")
        assert await first.slots_in_use(KEY, now=T0) == 1
        assert await first.renew_slot(KEY, "a", lease_s=LEASE, now=T0) is False
        assert await first.acquire_slot(KEY, "c", limit=2, lease_s=LEASE, now=T0) is True
    finally:
        await first.close()
        await second.close()


async def test_sqlite_file_made_before_slots_existed_gains_the_table(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    engine = SQLiteBackend(path)
    await engine.connect()
    await engine.close()
    with sqlite3.connect(path) as conn:  # what a file of an earlier release looks like
        conn.execute("DROP TABLE slots")
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    engine = SQLiteBackend(path)
    await engine.connect()
    try:
        assert await engine.acquire_slot(KEY, "a", limit=1, lease_s=LEASE, now=T0) is True
        assert await engine.slots_in_use(KEY, now=T0) == 1
    finally:
        await engine.close()


async def test_sqlite_purge_drops_ended_slot_leases(tmp_path: Path) -> None:
    path = str(tmp_path / "purge.db")
    engine = SQLiteBackend(path)
    await engine.connect()
    try:
        assert await engine.acquire_slot("m1", "a", limit=1, lease_s=5, now=T0) is True
        assert await engine.acquire_slot("m2", "b", limit=1, lease_s=50, now=T0) is True
        assert await engine.purge_expired(now=T0 + 5, limit=10) == 0
    finally:
        await engine.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT key, holder FROM slots").fetchall()
    conn.close()
    assert rows == [("m2", "b")]
