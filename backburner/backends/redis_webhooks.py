"""The webhook outbox of the Redis backend (a mixin of ``RedisBackend``).

The terminal transitions (``finish.lua``, ``cancel.lua``) write a job's messages, and
``add_progress_webhook`` a running job's ``task.progress`` ones; these methods lease, log,
redeliver and count them, each in one script. A message is a hash ``wh:<msg_id>`` whose fields
hold JSON text like a job's, ``wh:due`` holds pending msg ids by next_at, ``wh:delivered`` and
``wh:failed`` settled ones by the time of their last attempt, and ``wh:job:<task_id>`` lists a
job's msg ids, oldest first (docs/redis.md, "Keys"). A message's ``claim`` grows with every
claim and redelivery, and ``record_webhook_attempt`` applies only under the current one, so a
dispatcher whose lease ended cannot log over the one that took the message next.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError, InvalidTransitionError, JobNotFoundError, LeaseLostError
from ..models import PROGRESS_EVENT, WebhookAttempt, WebhookDelivery, WebhookStatus
from .outbox import new_msg_id
from .redis_codec import decode_webhooks, number

WEBHOOK_SCRIPTS = (
    "claim_webhooks",
    "record_webhook_attempt",
    "read_webhooks",
    "redeliver_webhook",
    "add_progress_webhook",
    "webhook_counts",
    "failed_webhooks",
)
WEBHOOK_READS = ("read_webhooks", "webhook_counts", "failed_webhooks")
"""The scripts of WEBHOOK_SCRIPTS that write nothing."""

WEBHOOK_SAFE_TO_REPEAT = frozenset({*WEBHOOK_READS, "redeliver_webhook"})
"""Reads, and a redelivery: sent twice, it leaves the message as once but for one more claim
number, which at most fences out an attempt begun in between (the message is then sent again,
as at-least-once delivery allows)."""

_FAILED_CURSOR = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?(?:e[-+][0-9]+)?):(.+)", re.DOTALL)
"""A page of failed messages ends at ``<time of its last failure>:<msg_id>``."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parse_failed_cursor(cursor: str | None) -> tuple[str, str]:
    if cursor is None:
        return "", ""
    match = _FAILED_CURSOR.fullmatch(cursor)
    if match is None:
        raise InvalidInputError(f"invalid cursor {cursor!r}")
    return number(float(match[1])), match[2]


class RedisWebhookOutbox:
    """``add_progress_webhook``, ``claim_webhooks``, ``record_webhook_attempt``,
    ``webhook_deliveries``, ``redeliver_webhook``, ``webhook_counts`` and ``failed_webhooks``
    on the scripts of ``WEBHOOK_SCRIPTS``."""

    if TYPE_CHECKING:

        async def _run(self, name: str, *args: str | int | float) -> Any: ...

    async def add_progress_webhook(self, task_id: str, fence: int, *, now: float) -> bool:
        reply = await self._run(
            "add_progress_webhook", task_id, fence, number(now), new_msg_id(), PROGRESS_EVENT
        )
        if reply[0] != b"ok":
            raise LeaseLostError(task_id, fence)
        return bool(reply[1])

    async def webhook_counts(self) -> dict[str, int]:
        pending, delivered, failed = await self._run("webhook_counts")
        return {
            WebhookStatus.PENDING.value: int(pending),
            WebhookStatus.DELIVERED.value: int(delivered),
            WebhookStatus.FAILED.value: int(failed),
        }

    async def failed_webhooks(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[WebhookDelivery], str | None]:
        score, after = _parse_failed_cursor(cursor)
        if limit <= 0:
            return [], None
        reply = await self._run("failed_webhooks", limit, score, after)
        last_at, last_msg = _text(reply[0]), _text(reply[1])
        following = f"{number(float(last_at))}:{last_msg}" if last_msg else None
        return decode_webhooks(reply[2:]), following

    async def claim_webhooks(
        self, *, now: float, limit: int, lease_s: float
    ) -> list[WebhookDelivery]:
        if limit <= 0:
            return []
        documents = await self._run("claim_webhooks", number(now), limit, number(now + lease_s))
        return decode_webhooks(documents)

    async def record_webhook_attempt(
        self,
        msg_id: str,
        claim: int,
        attempt: WebhookAttempt,
        *,
        status: WebhookStatus,
        next_at: float | None,
        body: str,
    ) -> bool:
        status = WebhookStatus(status)
        if status is WebhookStatus.PENDING and next_at is None:
            raise InvalidInputError("a pending webhook message needs next_at")
        applied = await self._run(
            "record_webhook_attempt",
            msg_id,
            int(claim),
            attempt.model_dump_json(),
            json.dumps(status.value),
            "" if next_at is None else number(next_at),
            json.dumps(body),
            number(attempt.at),
        )
        return bool(applied)

    async def webhook_deliveries(self, task_id: str) -> list[WebhookDelivery]:
        reply = await self._run("read_webhooks", task_id)
        if reply[0] == b"missing":
            raise JobNotFoundError(task_id)
        return decode_webhooks(reply[1:])

    async def redeliver_webhook(
        self, task_id: str, *, now: float, keep_until: float | None = None
    ) -> WebhookDelivery:
        keep = "" if keep_until is None else number(keep_until)
        reply = await self._run("redeliver_webhook", task_id, number(now), keep)
        if reply[0] == b"missing":
            raise JobNotFoundError(task_id)
        if reply[0] == b"none":
            raise InvalidTransitionError(f"job {task_id} has no webhook message to redeliver")
        (message,) = decode_webhooks(reply[1:])
        return message
