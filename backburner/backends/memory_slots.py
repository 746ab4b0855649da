"""The memory backend's concurrency slots (for tests and demos, like the rest of it)."""

from __future__ import annotations

from .base import check_slot_args


class MemorySlots:
    """Slot key -> {holder: expires_at}; a key with no holders left is dropped."""

    _slots: dict[str, dict[str, float]]

    def _live_holders(self, key: str, now: float) -> dict[str, float]:
        """The holders of ``key`` whose lease has not ended, with the ended ones dropped."""
        holders = self._slots.get(key, {})
        for holder in [h for h, expires_at in holders.items() if expires_at <= now]:
            del holders[holder]
        return holders

    async def acquire_slot(
        self, key: str, holder: str, *, limit: int, lease_s: float, now: float
    ) -> bool:
        check_slot_args(key, holder, limit=limit, lease_s=lease_s)
        holders = self._live_holders(key, now)
        if holder not in holders and len(holders) >= limit:
            return False  # limit >= 1, so ``holders`` is not empty: the key stays
        self._slots[key] = holders
        holders[holder] = now + lease_s
        return True

    async def renew_slot(self, key: str, holder: str, *, lease_s: float, now: float) -> bool:
        check_slot_args(key, holder, lease_s=lease_s)
        holders = self._live_holders(key, now)
        if holder not in holders:
            if not holders:
                self._slots.pop(key, None)
            return False
        holders[holder] = now + lease_s
        return True

    async def release_slot(self, key: str, holder: str) -> None:
        check_slot_args(key, holder)
        holders = self._slots.get(key)
        if holders is not None:
            holders.pop(holder, None)
            if not holders:
                del self._slots[key]

    async def slots_in_use(self, key: str, *, now: float) -> int:
        check_slot_args(key)
        return sum(1 for expires_at in self._slots.get(key, {}).values() if expires_at > now)
