"""How a Redis worker waits for work: woken by Pub/Sub, or handed a job it did not claim.

A worker that waits registers as idle (``redis_lua/idle.lua``) once its hand-off channel is
subscribed; an enqueue that finds it claims the job for it and publishes the job on that
channel (prelude ``hand_off``). The job reaches the worker in the enqueue's own round trip:
no wake-up, then claim, then reply. A claim of the worker's own ends the registration
(the claim a finish makes for the slot it frees does not).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..aio import wait_set
from ..errors import BackendError
from ..jsoncodec import encode
from ..models import Job
from .redis_codec import number
from .redis_wake import WakeChannel

REGISTRATION_GRACE_S = 2.0
"""How long an idle registration outlives the wait that made it: a worker that died while
waiting is handed nothing after this (a job handed to it before runs when its lease ends)."""


class RedisWaiting:
    """``wait_for_jobs`` and ``stop_waiting``."""

    _p: str
    _wake: WakeChannel | None

    if TYPE_CHECKING:

        async def _run(self, name: str, *args: str | int | float) -> Any: ...

        async def _taken(
            self, documents: Sequence[Any], now: float, *, expired_only: bool = False
        ) -> list[Job]: ...

        def _taken_one(self, document: bytes, now: float) -> Job | None: ...

    def _hand_channel(self, worker_id: str) -> str:
        return f"{self._p}hand:{worker_id}"

    async def wait_for_jobs(
        self,
        *,
        now: float,
        timeout: float,
        types: Sequence[str] | None = None,
        worker_id: str | None = None,
        lease_s: float = 30.0,
        on_handed: Callable[[Job], None] | None = None,
    ) -> list[Job]:
        if types is not None and not types:
            await asyncio.sleep(timeout)
            return []
        wake = self._wake
        if wake is None:
            raise BackendError("the Redis backend is not connected (call connect() first)")
        loop = asyncio.get_running_loop()
        started = loop.time()
        inbox = None if worker_id is None else await wake.inbox(self._hand_channel(worker_id))
        with wake.listen(types) as woken:
            # Subscribed before looking, so nothing enqueued after the look goes unnoticed.
            if not await wake.ready(timeout):
                return []
            if inbox is not None and inbox.docs:
                return await self._taken(inbox.take(), now)
            if inbox is not None and on_handed is not None:
                # Started the moment it arrives, now or after this wait (the registration may
                # outlive it): never left waiting in the inbox while its lease runs.
                def deliver(doc: bytes) -> None:
                    job = self._taken_one(doc, now)
                    if job is not None:
                        on_handed(job)

                inbox.deliver = deliver
            try:
                if inbox is not None and inbox.subscribed.is_set():
                    assert worker_id is not None
                    inbox.notify = woken
                    next_due = await self._run(
                        "idle",
                        worker_id,
                        encode(worker_id),
                        number(lease_s),
                        number(timeout + REGISTRATION_GRACE_S),
                        *(types or ()),
                    )
                else:  # no hand-off channel (yet): waking is enough
                    next_due = await self._run("next_due", *(types or ()))
                elapsed = loop.time() - started
                if next_due is not None:
                    due_in = float(next_due) - now - elapsed if next_due != b"0" else 0.0
                    timeout = 0.0 if due_in <= 0 else min(timeout, due_in + elapsed)
                if timeout > elapsed and not (inbox is not None and inbox.docs):
                    await wait_set(woken, timeout - elapsed)
            finally:
                if inbox is not None:
                    inbox.notify = None
        return [] if inbox is None else await self._taken(inbox.take(), now)

    async def stop_waiting(self, worker_id: str) -> list[Job]:
        wake = self._wake
        if wake is None:
            return []
        try:
            await self._run("unidle", worker_id)
        finally:  # (a registration left behind lapses by itself)
            docs = await wake.close_inbox(self._hand_channel(worker_id))
        return await self._taken(docs, time.time())
