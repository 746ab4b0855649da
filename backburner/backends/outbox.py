"""What every backend's webhook outbox shares: the message a terminal transition writes."""

from __future__ import annotations

from ..models import WEBHOOK_EVENTS, Job, JobStatus, WebhookDelivery, WebhookStatus
from .base import uuid4_hex

WEBHOOK_KEEP_S = 3600.0
"""How long past a pending webhook message's next attempt its job is kept at least (as the
Redis script record_webhook_attempt.lua keeps it too)."""


def new_msg_id() -> str:
    """A webhook message id: ``msg_`` and a uuid4's 32 hex digits (122 random bits)."""
    return "msg_" + uuid4_hex()


def webhook_event(status: JobStatus) -> str | None:
    """The webhook event of a terminal status (None for the others)."""
    return WEBHOOK_EVENTS.get(status)


def new_message(
    job: Job, now: float, msg_id: str | None = None, *, event: str | None = None
) -> WebhookDelivery | None:
    """The pending message for a job that just became terminal (or of ``event``); None
    without a webhook_url."""
    event = event or webhook_event(job.status)
    if job.webhook_url is None or event is None:
        return None
    return WebhookDelivery(
        msg_id=msg_id or new_msg_id(),
        task_id=job.task_id,
        event=event,
        url=job.webhook_url,
        status=WebhookStatus.PENDING,
        created_at=now,
        next_at=now,
    )
