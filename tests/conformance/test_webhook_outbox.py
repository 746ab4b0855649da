"""The webhook outbox: written with the terminal transition, leased, logged, redelivered."""

from __future__ import annotations

import asyncio
import re

import pytest

from backburner.backends import Backend
from backburner.backends.base import Complete, Fail, Release, RetryAt
from backburner.errors import InvalidTransitionError, JobNotFoundError, LeaseLostError
from backburner.models import JobStatus, WebhookAttempt, WebhookStatus

from ._support import LEASE, T0, claim_one, enqueue, error

HOOK = "https://hooks.example.com/in"


async def running(backend: Backend, *, webhook_url: str | None = HOOK) -> tuple[str, int]:
    job = await enqueue(backend, webhook_url=webhook_url)
    claimed = await claim_one(backend, job.task_id)
    return job.task_id, claimed.fence


async def test_completing_a_job_with_a_webhook_writes_one_pending_message(
    backend: Backend,
) -> None:
    task_id, fence = await running(backend)
    assert await backend.webhook_deliveries(task_id) == []
    await backend.finish(task_id, fence, Complete(result={"ok": 1}), now=T0 + 5)
    (message,) = await backend.webhook_deliveries(task_id)
    assert re.fullmatch(r"msg_[0-9a-f]{32}", message.msg_id)
    assert (message.task_id, message.event, message.url) == (task_id, "task.completed", HOOK)
    assert message.status is WebhookStatus.PENDING
    assert message.created_at == T0 + 5 and message.next_at == T0 + 5
    assert message.body is None and message.attempts == []


@pytest.mark.parametrize("how", ["fail", "cancel-processing", "cancel-queued"])
async def test_failing_and_cancelling_write_their_own_event(backend: Backend, how: str) -> None:
    if how == "cancel-queued":
        task_id = (await enqueue(backend, webhook_url=HOOK)).task_id
        await backend.cancel(task_id, now=T0 + 3)
        expected = "task.cancelled"
    else:
        task_id, fence = await running(backend)
        if how == "fail":
            await backend.finish(task_id, fence, Fail(error(), ttl_s=900.0), now=T0 + 3)
            expected = "task.failed"
        else:
            await backend.cancel(task_id, now=T0 + 3)
            expected = "task.cancelled"
    (message,) = await backend.webhook_deliveries(task_id)
    assert message.event == expected and message.next_at == T0 + 3


async def test_no_message_without_a_webhook_url_or_for_a_retry(backend: Backend) -> None:
    plain, fence = await running(backend, webhook_url=None)
    await backend.finish(plain, fence, Complete(result=None), now=T0 + 1)
    assert await backend.webhook_deliveries(plain) == []
    retried, fence = await running(backend)
    await backend.finish(retried, fence, RetryAt(error(), run_at=T0 + 50), now=T0 + 1)
    released = (await claim_one(backend, retried, now=T0 + 60)).fence
    await backend.finish(retried, released, Release(), now=T0 + 61)
    assert await backend.webhook_deliveries(retried) == []
    assert await backend.claim_webhooks(now=T0 + 100, limit=10, lease_s=LEASE) == []


async def test_a_fenced_off_finish_writes_no_message(backend: Backend) -> None:
    task_id, fence = await running(backend)
    await backend.cancel(task_id, now=T0 + 1)  # one message: task.cancelled
    with pytest.raises(Exception):  # noqa: B017 - LeaseLostError; the point is what follows
        await backend.finish(task_id, fence, Complete(result=None), now=T0 + 2)
    assert [m.event for m in await backend.webhook_deliveries(task_id)] == ["task.cancelled"]


async def test_claim_leases_due_messages_oldest_first(backend: Backend) -> None:
    ids = []
    for i in range(3):
        task_id, fence = await running(backend)
        await backend.finish(task_id, fence, Complete(result=i), now=T0 + 10 - i)
        ids.append(task_id)
    assert await backend.claim_webhooks(now=T0 + 7, limit=10, lease_s=LEASE) == []
    first = await backend.claim_webhooks(now=T0 + 20, limit=2, lease_s=LEASE)
    assert [m.task_id for m in first] == [ids[2], ids[1]]
    assert all(m.next_at == T0 + 20 + LEASE for m in first)
    second = await backend.claim_webhooks(now=T0 + 21, limit=10, lease_s=LEASE)
    assert [m.task_id for m in second] == [ids[0]]
    # A dispatcher that died: its messages are due again when the lease ends.
    again = await backend.claim_webhooks(now=T0 + 20 + LEASE, limit=10, lease_s=LEASE)
    assert {m.task_id for m in again} == {ids[1], ids[2]}


async def test_concurrent_claims_never_hand_out_a_message_twice(backend: Backend) -> None:
    for _ in range(6):
        task_id, fence = await running(backend)
        await backend.finish(task_id, fence, Complete(result=None), now=T0 + 1)
    batches = await asyncio.gather(
        *(backend.claim_webhooks(now=T0 + 2, limit=2, lease_s=LEASE) for _ in range(5))
    )
    claimed = [m.msg_id for batch in batches for m in batch]
    assert len(claimed) == 6 and len(set(claimed)) == 6


async def test_attempts_are_logged_and_the_first_fixes_the_body(backend: Backend) -> None:
    task_id, fence = await running(backend)
    await backend.finish(task_id, fence, Complete(result=None), now=T0 + 1)
    (message,) = await backend.claim_webhooks(now=T0 + 1, limit=1, lease_s=LEASE)
    failed = WebhookAttempt(at=T0 + 1, status_code=503, latency_ms=12.5, error="503")
    await backend.record_webhook_attempt(
        message.msg_id,
        message.claim,
        failed,
        status=WebhookStatus.PENDING,
        next_at=T0 + 6,
        body='{"a":1}',
    )
    assert await backend.claim_webhooks(now=T0 + 5, limit=1, lease_s=LEASE) == []
    (retry,) = await backend.claim_webhooks(now=T0 + 6, limit=1, lease_s=LEASE)
    assert retry.body == '{"a":1}' and retry.attempts == [failed]
    assert (message.claim, retry.claim, retry.tries) == (1, 2, 1)
    ok = WebhookAttempt(at=T0 + 6, status_code=204, latency_ms=3.0)
    assert await backend.record_webhook_attempt(
        message.msg_id,
        retry.claim,
        ok,
        status=WebhookStatus.DELIVERED,
        next_at=None,
        body='{"other":2}',
    )
    (done,) = await backend.webhook_deliveries(task_id)
    assert done.status is WebhookStatus.DELIVERED and done.next_at is None
    assert done.body == '{"a":1}' and done.attempts == [failed, ok] and done.tries == 2
    assert await backend.claim_webhooks(now=T0 + 10_000, limit=1, lease_s=LEASE) == []


async def test_a_dispatcher_whose_lease_ended_cannot_overwrite_the_outcome(
    backend: Backend,
) -> None:
    task_id, fence = await running(backend)
    await backend.finish(task_id, fence, Complete(result=None), now=T0 + 1)
    (stale,) = await backend.claim_webhooks(now=T0 + 1, limit=1, lease_s=LEASE)
    (fresh,) = await backend.claim_webhooks(now=T0 + 1 + LEASE, limit=1, lease_s=LEASE)
    ok = WebhookAttempt(at=T0 + 40, status_code=200)
    assert await backend.record_webhook_attempt(
        fresh.msg_id, fresh.claim, ok, status=WebhookStatus.DELIVERED, next_at=None, body="{}"
    )
    late = WebhookAttempt(at=T0 + 41, error="ReadTimeout")
    assert not await backend.record_webhook_attempt(
        stale.msg_id, stale.claim, late, status=WebhookStatus.PENDING, next_at=T0 + 50, body="{}"
    )
    (message,) = await backend.webhook_deliveries(task_id)
    assert message.status is WebhookStatus.DELIVERED and message.attempts == [ok]
    # A redelivery also fences off the attempt in flight, and starts counting tries again.
    again = await backend.redeliver_webhook(task_id, now=T0 + 60)
    assert again.claim == fresh.claim + 1 and again.tries == 0
    assert not await backend.record_webhook_attempt(
        fresh.msg_id, fresh.claim, ok, status=WebhookStatus.DELIVERED, next_at=None, body="{}"
    )


async def test_a_failed_message_can_be_redelivered_with_the_same_id_and_body(
    backend: Backend,
) -> None:
    task_id, fence = await running(backend)
    await backend.finish(task_id, fence, Complete(result=None), now=T0 + 1)
    (message,) = await backend.claim_webhooks(now=T0 + 1, limit=1, lease_s=LEASE)
    gone = WebhookAttempt(at=T0 + 1, status_code=410, error="410 Gone")
    await backend.record_webhook_attempt(
        message.msg_id, message.claim, gone, status=WebhookStatus.FAILED, next_at=None, body="{}"
    )
    again = await backend.redeliver_webhook(task_id, now=T0 + 50)
    assert again.msg_id == message.msg_id and again.status is WebhookStatus.PENDING
    assert again.next_at == T0 + 50 and again.body == "{}" and again.attempts == [gone]
    (due,) = await backend.claim_webhooks(now=T0 + 50, limit=1, lease_s=LEASE)
    assert due.msg_id == message.msg_id


async def test_a_redelivered_message_keeps_its_job_until_its_new_schedule_ends(
    backend: Backend,
) -> None:
    # The job expired on its first schedule's retention, taking the message being retried.
    task_id, fence = await running(backend)
    await backend.finish(task_id, fence, Complete(result=None), now=T0 + 1)
    expires = (await backend.get(task_id)).expires_at
    assert expires is not None
    await backend.redeliver_webhook(task_id, now=T0 + 2, keep_until=expires - 10)
    assert (await backend.get(task_id)).expires_at == expires  # never shortened
    keep = expires + 100_000.0
    await backend.redeliver_webhook(task_id, now=expires - 5, keep_until=keep)
    assert (await backend.get(task_id)).expires_at == keep
    assert await backend.purge_expired(now=expires + 50_000, limit=10) == 0
    (message,) = await backend.webhook_deliveries(task_id)
    assert message.status is WebhookStatus.PENDING
    assert await backend.purge_expired(now=keep + 1, limit=10) == 1
    with pytest.raises(JobNotFoundError):
        await backend.webhook_deliveries(task_id)


async def test_a_message_due_after_its_jobs_expiry_keeps_the_job(backend: Backend) -> None:
    # A receiver's Retry-After of a day outlasted the job (kept ~31 h): the message went with
    # it, never sent and counted nowhere.
    task_id, fence = await running(backend)
    await backend.finish(task_id, fence, Complete(result=None), now=T0 + 1)
    expires = (await backend.get(task_id)).expires_at
    assert expires is not None
    (message,) = await backend.claim_webhooks(now=T0 + 1, limit=1, lease_s=LEASE)
    busy = WebhookAttempt(at=T0 + 2, status_code=503, error="HTTP 503")
    later = expires + 50_000
    assert await backend.record_webhook_attempt(
        message.msg_id, message.claim, busy, status=WebhookStatus.PENDING, next_at=later, body="{}"
    )
    assert (await backend.get(task_id)).expires_at == later + 3600
    assert await backend.purge_expired(now=later, limit=10) == 0
    (due,) = await backend.claim_webhooks(now=later, limit=1, lease_s=LEASE)
    assert due.msg_id == message.msg_id
    soon = WebhookAttempt(at=later + 1, status_code=503, error="HTTP 503")
    assert await backend.record_webhook_attempt(  # an hour past the next try, at least
        due.msg_id, due.claim, soon, status=WebhookStatus.PENDING, next_at=later + 5, body="{}"
    )
    assert (await backend.get(task_id)).expires_at == later + 5 + 3600
    (again,) = await backend.claim_webhooks(now=later + 5, limit=1, lease_s=LEASE)
    sent = WebhookAttempt(at=later + 6, status_code=204)
    assert await backend.record_webhook_attempt(  # settled: its job's expiry stays as it is
        again.msg_id, again.claim, sent, status=WebhookStatus.DELIVERED, next_at=None, body="{}"
    )
    assert (await backend.get(task_id)).expires_at == later + 5 + 3600


async def test_redeliver_refuses_jobs_without_a_message(backend: Backend) -> None:
    with pytest.raises(JobNotFoundError):
        await backend.redeliver_webhook("task_" + "0" * 32, now=T0)
    with pytest.raises(JobNotFoundError):
        await backend.webhook_deliveries("task_" + "0" * 32)
    plain, fence = await running(backend, webhook_url=None)
    await backend.finish(plain, fence, Complete(result=None), now=T0 + 1)
    with pytest.raises(InvalidTransitionError):
        await backend.redeliver_webhook(plain, now=T0 + 2)
    queued = await enqueue(backend, webhook_url=HOOK)
    with pytest.raises(InvalidTransitionError):
        await backend.redeliver_webhook(queued.task_id, now=T0)


async def test_messages_go_with_their_job(backend: Backend) -> None:
    deleted, fence = await running(backend)
    await backend.finish(deleted, fence, Complete(result=None), now=T0 + 1)
    assert await backend.delete(deleted) is True
    expired, fence = await running(backend)
    await backend.finish(expired, fence, Fail(error(), ttl_s=10.0), now=T0 + 1)
    assert await backend.purge_expired(now=T0 + 100, limit=10) >= 1
    assert await backend.claim_webhooks(now=T0 + 100, limit=10, lease_s=LEASE) == []
    lost = await backend.claim_webhooks(now=T0 + 100, limit=10, lease_s=LEASE)
    assert lost == []
    assert not await backend.record_webhook_attempt(  # a deleted job's message: ignored
        "msg_" + "0" * 32,
        1,
        WebhookAttempt(at=T0),
        status=WebhookStatus.DELIVERED,
        next_at=None,
        body="{}",
    )


async def test_a_status_of_the_job_is_unchanged_by_its_messages(backend: Backend) -> None:
    task_id, fence = await running(backend)
    done = await backend.finish(task_id, fence, Complete(result=7), now=T0 + 1)
    await backend.claim_webhooks(now=T0 + 1, limit=1, lease_s=LEASE)
    stored = await backend.get(task_id)
    assert stored is not None and stored.model_dump() == done.model_dump()
    assert stored.status is JobStatus.COMPLETED


async def test_progress_messages_wait_one_at_a_time_for_jobs_that_opted_in(
    backend: Backend,
) -> None:
    job = await enqueue(backend, webhook_url=HOOK, webhook_progress=True)
    assert job.webhook_progress is True
    fence = (await claim_one(backend, job.task_id)).fence
    assert await backend.add_progress_webhook(job.task_id, fence, now=T0 + 1) is True
    assert await backend.add_progress_webhook(job.task_id, fence, now=T0 + 2) is False  # waits
    (message,) = await backend.claim_webhooks(now=T0 + 3, limit=5, lease_s=LEASE)
    assert message.event == "task.progress" and message.created_at == T0 + 1
    # Claimed but with no attempt made yet (waiting for a busy receiver's connection, say):
    # still unsent, so later progress waits in it too (the dispatcher follows a message that
    # went with older progress by another: dispatcher.py).
    assert await backend.add_progress_webhook(job.task_id, fence, now=T0 + 4) is False
    sent = WebhookAttempt(at=T0 + 4, status_code=204)
    await backend.record_webhook_attempt(
        message.msg_id, message.claim, sent, status=WebhookStatus.DELIVERED, next_at=None, body="{}"
    )
    # Sent: the next report makes the next message, which waits unsent in its turn.
    assert await backend.add_progress_webhook(job.task_id, fence, now=T0 + 4.5) is True
    assert await backend.add_progress_webhook(job.task_id, fence, now=T0 + 5) is False
    await backend.finish(job.task_id, fence, Complete(result=None), now=T0 + 6)
    events = [m.event for m in await backend.webhook_deliveries(job.task_id)]
    assert events == ["task.progress", "task.progress", "task.completed"]
    # redeliver goes to the latest message: the terminal one
    assert (await backend.redeliver_webhook(job.task_id, now=T0 + 7)).event == "task.completed"


async def test_progress_messages_need_the_opt_in_a_webhook_and_the_lease(
    backend: Backend,
) -> None:
    plain = await enqueue(backend, webhook_url=HOOK)
    fence = (await claim_one(backend, plain.task_id)).fence
    assert await backend.add_progress_webhook(plain.task_id, fence, now=T0 + 1) is False
    opted = await enqueue(backend, webhook_progress=True)  # no webhook_url: nowhere to send
    fence2 = (await claim_one(backend, opted.task_id)).fence
    assert await backend.add_progress_webhook(opted.task_id, fence2, now=T0 + 1) is False
    with pytest.raises(LeaseLostError):
        await backend.add_progress_webhook(plain.task_id, fence + 1, now=T0 + 2)
    assert await backend.webhook_deliveries(plain.task_id) == []


async def test_counts_and_the_list_of_failed_messages(backend: Backend) -> None:
    assert await backend.webhook_counts() == {"pending": 0, "delivered": 0, "failed": 0}
    ids = []
    for i in range(3):
        task_id, fence = await running(backend)
        await backend.finish(task_id, fence, Complete(result=i), now=T0 + i)
        ids.append(task_id)
    claimed = await backend.claim_webhooks(now=T0 + 10, limit=3, lease_s=LEASE)
    by_task = {m.task_id: m for m in claimed}
    for at, task_id in ((T0 + 20, ids[0]), (T0 + 30, ids[2])):
        gone = WebhookAttempt(at=at, status_code=410, error="HTTP 410")
        await backend.record_webhook_attempt(
            by_task[task_id].msg_id,
            by_task[task_id].claim,
            gone,
            status=WebhookStatus.FAILED,
            next_at=None,
            body="{}",
        )
    assert await backend.webhook_counts() == {"pending": 1, "delivered": 0, "failed": 2}
    page, cursor = await backend.failed_webhooks(limit=1)
    assert [m.task_id for m in page] == [ids[2]] and cursor is not None
    rest, end = await backend.failed_webhooks(limit=5, cursor=cursor)
    assert [m.task_id for m in rest] == [ids[0]] and end is None
    assert rest[0].attempts[-1].status_code == 410
    assert await backend.delete(ids[0]) is True  # its messages go with it
    assert await backend.webhook_counts() == {"pending": 1, "delivered": 0, "failed": 1}
