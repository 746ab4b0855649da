"""The memory backend's webhook outbox (for tests and demos, like the rest of it)."""

from __future__ import annotations

from ..errors import InvalidTransitionError
from ..models import Job, WebhookAttempt, WebhookDelivery, WebhookStatus
from .outbox import new_message


class MemoryOutbox:
    """Messages by id, and each job's message ids in creation order."""

    def __init__(self) -> None:
        self._messages: dict[str, WebhookDelivery] = {}
        self._by_task: dict[str, list[str]] = {}

    def write(self, job: Job, now: float) -> None:
        """Add the message of ``job``, which has just become terminal (if it has a webhook)."""
        message = new_message(job, now)
        if message is not None:
            self._messages[message.msg_id] = message
            self._by_task.setdefault(job.task_id, []).append(message.msg_id)

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
            leased = message.model_copy(update={"next_at": now + lease_s})
            self._messages[message.msg_id] = leased
            claimed.append(leased)
        return claimed

    def record(
        self,
        msg_id: str,
        attempt: WebhookAttempt,
        *,
        status: WebhookStatus,
        next_at: float | None,
        body: str,
    ) -> None:
        message = self._messages.get(msg_id)
        if message is None:
            return
        self._messages[msg_id] = message.model_copy(
            update={
                "status": status,
                "next_at": next_at if status is WebhookStatus.PENDING else None,
                "body": message.body if message.body is not None else body,
                "attempts": [*message.attempts, attempt],
            }
        )

    def of_task(self, task_id: str) -> list[WebhookDelivery]:
        return [self._messages[m] for m in self._by_task.get(task_id, [])]

    def redeliver(self, task_id: str, now: float) -> WebhookDelivery:
        ids = self._by_task.get(task_id)
        if not ids:
            raise InvalidTransitionError(f"job {task_id} has no webhook message to redeliver")
        message = self._messages[ids[-1]].model_copy(
            update={"status": WebhookStatus.PENDING, "next_at": now}
        )
        self._messages[message.msg_id] = message
        return message
