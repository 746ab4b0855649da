"""Long attempt timeouts, enforced by one timer per second of the clock instead of one each."""

from __future__ import annotations

import asyncio
import contextvars
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .attempt import Attempt

TIMED_OUT = "timed_out"
"""An Attempt's stop_reason once its timeout cancelled it (a failure of type ``timeout``)."""


class CoarseTimeouts:
    """Cancels attempts whose timeout passed, up to ``grain_s`` late.

    ``asyncio.timeout`` makes a Timeout and a timer for every attempt, and moves and cancels
    the timer: about 6% of a worker's CPU when it drains no-op jobs with the default timeout of
    an hour (py-spy). Here attempts due in the same grain share one timer; arming one is a set
    insertion. Only for timeouts long enough that a grain late does not matter
    (``min_timeout_s``); shorter ones keep ``asyncio.timeout``."""

    def __init__(self, *, grain_s: float = 1.0, min_timeout_s: float = 30.0) -> None:
        self.grain_s = grain_s
        self.min_timeout_s = min_timeout_s
        self._due: dict[int, set[Attempt]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def arm(self, attempt: Attempt, timeout: float) -> int:
        """Cancel ``attempt`` (its task, stop_reason TIMED_OUT) once ``timeout`` seconds have
        passed, unless disarmed first. Returns the slot to disarm it with."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # (a worker run again: the old loop's timers are gone)
            self._loop, self._due = loop, {}
        slot = math.ceil((loop.time() + timeout) / self.grain_s)
        attempts = self._due.get(slot)
        if attempts is None:
            attempts = self._due[slot] = set()
            # In a context of its own: a copy of the arming job's (its JobContext, the job, its
            # input) would live as long as the timer, for the whole timeout. A worker running
            # batches (an hour's timeout, megabytes of input) kept every one it had ended.
            loop.call_at(slot * self.grain_s, self._expire, slot, context=contextvars.Context())
        attempts.add(attempt)
        return slot

    def disarm(self, attempt: Attempt, slot: int) -> None:
        attempts = self._due.get(slot)
        if attempts is not None:
            attempts.discard(attempt)

    def _expire(self, slot: int) -> None:
        for attempt in self._due.pop(slot, ()):
            task = attempt.task
            if task is None or task.done() or attempt.stop_reason is not None or attempt.storing:
                continue
            attempt.stop_reason = TIMED_OUT
            task.cancel()

    def armed(self) -> int:
        """How many attempts are armed (for tests)."""
        return sum(len(attempts) for attempts in self._due.values())
