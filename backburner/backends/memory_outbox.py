"""The memory backend's webhook outbox (for tests and demos, like the rest of it)."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInputError, InvalidTransitionError, JobNotFoundError
from ..models import PROGRESS_EVENT, Job, WebhookAttempt, WebhookDelivery, WebhookStatus
from .outbox import WEBHOOK_KEEP_S, new_message


class MemoryOutbox:
    """Messages by id, and each job's message ids in creation order."""

    def __init__(self) -> None:
        self._messages: dict[str, WebhookDelivery] = {}
        self._by_task: dict[str, list[str]] = {}

    def write(self, job: Job, now: float, event: str | None = None) -> bool:
        """Add the message of ``job``, which has just become terminal (if it has a webhook),
        or of ``event``. True if one was written."""
        message = new_message(job, now, event=event)
        if message is None:
            return False
        self._messages[message.msg_id] = message
        self._by_task.setdefault(job.task_id, []).append(message.msg_id)
        return True

    def add_progress(self, job: Job, now: float) -> bool:
        if job.webhook_url is None or not job.webhook_progress:
            return False
        for message in self.of_task(job.task_id):
            unsent = message.status is WebhookStatus.PENDING and message.body is None
            if message.event == PROGRESS_EVENT and unsent:
                return False
        return self.write(job, now, event=PROGRESS_EVENT)

    def counts(self) -> dict[str, int]:
        counts = {status.value: 0 for status in WebhookStatus}
        for message in self._messages.values():
            counts[message.status.value] += 1
        return counts

    def failed(self, limit: int, cursor: str | None) -> tuple[list[WebhookDelivery], str | None]:
        def key(m: WebhookDelivery) -> tuple[float, str]:
            return (m.attempts[-1].at if m.attempts else m.created_at, m.msg_id)

        failed = sorted(
            (m for m in self._messages.values() if m.status is WebhookStatus.FAILED),
            key=key,
            reverse=True,
        )
        if cursor is not None:
            failed = [m for m in failed if key(m) < _cursor_key(cursor)]
        page = failed[:limit]
        more = len(failed) > limit
        return page, (f"{key(page[-1])[0]!r}:{page[-1].msg_id}" if more else None)

    def drop(self, task_id: str) -> None:
        for msg_id in self._by_task.pop(task_id, []):
            self._messages.pop(msg_id, None)

    def claim(self, *, now: float, limit: int, lease_s: float) -> list[WebhookDelivery]:
        due = [
            m
            for m in self._messages.values()
            if m.status is WebhookStatus.PENDING and m.next_at is not None and m.next_at <= now
        ]
        due.sort(key=lambda m: (m.next_at or 0.0, m.created_at))
        claimed = []
        for message in due[:limit]:
            leased = message.model_copy(
                update={"next_at": now + lease_s, "claim": message.claim + 1}
            )
            self._messages[message.msg_id] = leased
            claimed.append(leased)
        return claimed

    def record(
        self,
        msg_id: str,
        claim: int,
        attempt: WebhookAttempt,
        *,
        status: WebhookStatus,
        next_at: float | None,
        body: str,
    ) -> bool:
        message = self._messages.get(msg_id)
        if message is None or message.status is not WebhookStatus.PENDING:
            return False
        if message.claim != claim:
            return False
        self._messages[msg_id] = message.model_copy(
            update={
                "status": status,
                "next_at": next_at if status is WebhookStatus.PENDING else None,
                "body": message.body if message.body is not None else body,
                "attempts": [*message.attempts, attempt],
                "tries": message.tries + 1,
            }
        )
        return True

    def of_task(self, task_id: str) -> list[WebhookDelivery]:
        return [self._messages[m] for m in self._by_task.get(task_id, [])]

    def redeliver(self, task_id: str, now: float) -> WebhookDelivery:
        ids = self._by_task.get(task_id)
        if not ids:
            raise InvalidTransitionError(f"job {task_id} has no webhook message to redeliver")
        latest = self._messages[ids[-1]]
        message = latest.model_copy(
            update={
                "status": WebhookStatus.PENDING,
                "next_at": now,
                "claim": latest.claim + 1,
                "tries": 0,
            }
        )
        self._messages[message.msg_id] = message
        return message


def _cursor_key(cursor: str) -> tuple[float, str]:
    at, _, msg_id = cursor.partition(":")
    try:
        return float(at), msg_id
    except ValueError:
        raise InvalidInputError(f"not a cursor of this listing: {cursor!r}") from None


class MemoryWebhooks:
    """The outbox part of the ``Backend`` contract for ``MemoryBackend``."""

    _outbox: MemoryOutbox
    _jobs: dict[str, Any]

    def _held(self, task_id: str, fence: int) -> Any:
        raise NotImplementedError  # MemoryBackend's

    async def add_progress_webhook(self, task_id: str, fence: int, *, now: float) -> bool:
        return self._outbox.add_progress(self._held(task_id, fence).job, now)

    async def webhook_counts(self) -> dict[str, int]:
        return self._outbox.counts()

    async def failed_webhooks(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[WebhookDelivery], str | None]:
        return self._outbox.failed(limit, cursor)

    async def claim_webhooks(
        self, *, now: float, limit: int, lease_s: float
    ) -> list[WebhookDelivery]:
        return self._outbox.claim(now=now, limit=limit, lease_s=lease_s)

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
        recorded = self._outbox.record(
            msg_id, claim, attempt, status=status, next_at=next_at, body=body
        )
        message = self._outbox._messages.get(msg_id)
        if recorded and message is not None and status is WebhookStatus.PENDING and next_at:
            stored = self._jobs.get(message.task_id)
            keep = next_at + WEBHOOK_KEEP_S
            expires = None if stored is None else stored.job.expires_at
            if stored is not None and expires is not None and expires < keep:
                stored.job = stored.job.model_copy(update={"expires_at": keep})
        return recorded

    async def webhook_deliveries(self, task_id: str) -> list[WebhookDelivery]:
        if task_id not in self._jobs:
            raise JobNotFoundError(task_id)
        return self._outbox.of_task(task_id)

    async def redeliver_webhook(
        self, task_id: str, *, now: float, keep_until: float | None = None
    ) -> WebhookDelivery:
        stored = self._jobs.get(task_id)
        if stored is None:
            raise JobNotFoundError(task_id)
        message = self._outbox.redeliver(task_id, now)
        expires = stored.job.expires_at
        if keep_until is not None and expires is not None and expires < keep_until:
            stored.job = stored.job.model_copy(update={"expires_at": keep_until})
        return message
