"""The webhook outbox of the Redis backend (a mixin of ``RedisBackend``).

The terminal transitions (``finish.lua``, ``cancel.lua``) write a job's messages; these methods
lease, log and redeliver them, each in one script. A message is a hash ``wh:<msg_id>`` whose
fields hold JSON text like a job's, ``wh:due`` holds pending msg ids by next_at, and
``wh:job:<task_id>`` lists a job's msg ids, oldest first (docs/redis.md, "Keys").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError, InvalidTransitionError, JobNotFoundError
from ..models import WebhookAttempt, WebhookDelivery, WebhookStatus
from .redis_codec import decode_webhooks, number

WEBHOOK_SCRIPTS = ("claim_webhooks", "record_webhook_attempt", "read_webhooks", "redeliver_webhook")
WEBHOOK_SAFE_TO_REPEAT = frozenset({"read_webhooks", "redeliver_webhook"})
"""A read, and a redelivery (sent twice, it leaves the message as once)."""


class RedisWebhookOutbox:
    """``claim_webhooks``, ``record_webhook_attempt``, ``webhook_deliveries`` and
    ``redeliver_webhook`` on the scripts of ``WEBHOOK_SCRIPTS``."""

    if TYPE_CHECKING:

        async def _run(self, name: str, *args: str | int | float) -> Any: ...

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
        attempt: WebhookAttempt,
        *,
        status: WebhookStatus,
        next_at: float | None,
        body: str,
    ) -> None:
        status = WebhookStatus(status)
        if status is WebhookStatus.PENDING and next_at is None:
            raise InvalidInputError("a pending webhook message needs next_at")
        await self._run(
            "record_webhook_attempt",
            msg_id,
            attempt.model_dump_json(),
            json.dumps(status.value),
            "" if next_at is None else number(next_at),
            json.dumps(body),
        )

    async def webhook_deliveries(self, task_id: str) -> list[WebhookDelivery]:
        reply = await self._run("read_webhooks", task_id)
        if reply[0] == b"missing":
            raise JobNotFoundError(task_id)
        return decode_webhooks(reply[1:])

    async def redeliver_webhook(self, task_id: str, *, now: float) -> WebhookDelivery:
        reply = await self._run("redeliver_webhook", task_id, number(now))
        if reply[0] == b"missing":
            raise JobNotFoundError(task_id)
        if reply[0] == b"none":
            raise InvalidTransitionError(f"job {task_id} has no webhook message to redeliver")
        (message,) = decode_webhooks(reply[1:])
        return message
