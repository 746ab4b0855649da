"""Webhooks end to end: a worker, the outbox, and a real receiver on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from backburner import Backburner
from backburner.errors import InvalidInputError, UnsafeURLError
from backburner.models import WebhookStatus
from backburner.webhooks import verify
from backburner.webhooks.alerts import DeadLetterAlerts

from ..helpers import eventually, running_worker
from .conftest import SECRET
from .receiver import Answer, Receiver, free_port, receiver

pytestmark = pytest.mark.timeout(60)


async def delivered(bb: Backburner, task_id: str) -> None:
    async def done() -> bool:
        messages = await bb.webhooks(task_id)
        return bool(messages) and messages[-1].status is not WebhookStatus.PENDING

    await eventually(done, timeout=30, message="the webhook settled")


async def test_a_completed_job_posts_a_signed_body_that_verifies(
    hooks: Receiver, make: Any
) -> None:
    bb = await make()
    async with running_worker(bb):
        job = await bb.enqueue(
            "echo", {"value": 42}, webhook_url=hooks.url("/ok"), metadata={"u": 1}
        )
        (request,) = await asyncio.to_thread(hooks.state.wait_for, "/ok", 1)
        await delivered(bb, job.task_id)
    verify(SECRET, request.headers, request.body)
    body = json.loads(request.body)
    done = await bb.get(job.task_id)
    assert body == {
        "type": "task.completed",
        "task_id": job.task_id,
        "status": "completed",
        "result": {"echo": 42},
        "usage": {"input_tokens": 1, "output_tokens": 2},
        "metadata": {"u": 1},
        "created_at": done.created_at,
        "finished_at": done.finished_at,
    }
    (message,) = await bb.webhooks(job.task_id)
    assert request.headers["webhook-id"] == message.msg_id
    assert request.headers["content-type"] == "application/json"
    assert message.status is WebhookStatus.DELIVERED and message.body == request.body.decode()
    (attempt,) = message.attempts
    assert attempt.status_code == 204 and attempt.error is None and attempt.latency_ms > 0


async def test_failures_retry_with_the_same_id_until_it_is_delivered(
    hooks: Receiver, make: Any
) -> None:
    hooks.state.plan("/flaky", Answer(500), Answer(502), Answer(404))
    bb = await make()
    async with running_worker(bb):
        job = await bb.enqueue("broken", webhook_url=hooks.url("/flaky"))
        requests = await asyncio.to_thread(hooks.state.wait_for, "/flaky", 4)
        await delivered(bb, job.task_id)
    assert len({r.headers["webhook-id"] for r in requests}) == 1
    assert len({r.body for r in requests}) == 1  # the same bytes every time
    assert json.loads(requests[0].body)["type"] == "task.failed"
    assert json.loads(requests[0].body)["error"]["type"] == "ValueError"
    for request in requests:
        verify(SECRET, request.headers, request.body)
    (message,) = await bb.webhooks(job.task_id)
    assert [a.status_code for a in message.attempts] == [500, 502, 404, 204]
    assert message.status is WebhookStatus.DELIVERED


async def test_a_receiver_that_is_down_then_up_gets_it(make: Any) -> None:
    port = free_port()
    bb = await make(webhook_retry_schedule="0,0.3,0.3,0.3,0.3,0.3,0.3")
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=f"http://127.0.0.1:{port}/late")

        async def refused() -> bool:
            messages = await bb.webhooks(job.task_id)
            return bool(messages) and len(messages[0].attempts) >= 1

        await eventually(refused, message="a first attempt, refused")
        with receiver(port) as late:
            await asyncio.to_thread(late.state.wait_for, "/late", 1)
            await delivered(bb, job.task_id)
    (message,) = await bb.webhooks(job.task_id)
    assert message.status is WebhookStatus.DELIVERED
    assert message.attempts[0].status_code is None and "ConnectError" in (
        message.attempts[0].error or ""
    )
    assert message.attempts[-1].status_code == 204


async def test_429_retry_after_is_waited_for(hooks: Receiver, make: Any) -> None:
    hooks.state.plan("/busy", Answer(429, {"Retry-After": "1"}))
    bb = await make()  # the schedule's own delay would be 0.2 s
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/busy"))
        first, second = await asyncio.to_thread(hooks.state.wait_for, "/busy", 2)
        await delivered(bb, job.task_id)
    assert 1.0 <= second.at - first.at < 3.0, second.at - first.at


async def test_410_gone_stops_at_once(hooks: Receiver, make: Any) -> None:
    hooks.state.plan("/gone", Answer(410))
    bb = await make()
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/gone"))
        await delivered(bb, job.task_id)
        (message,) = await bb.webhooks(job.task_id)
        assert message.status is WebhookStatus.FAILED and len(message.attempts) == 1
        assert await bb.backend.claim_webhooks(now=bb.clock.now() + 1e6, limit=9, lease_s=1) == []
    assert len(hooks.state.at("/gone")) == 1


async def test_the_schedule_runs_out_and_the_message_fails(
    hooks: Receiver, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hooks.state.plan("/down", *[Answer(503)] * 10)
    bb = await make(webhook_retry_schedule="0,0.1,0.1")
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/down?token=s3cret"))
        await delivered(bb, job.task_id)
    (message,) = await bb.webhooks(job.task_id)
    assert message.status is WebhookStatus.FAILED
    assert [a.status_code for a in message.attempts] == [503, 503, 503]
    assert len(hooks.state.at("/down")) == 3
    # The log names the receiver, not the URL's path and query, where tokens go.
    assert f"to http://127.0.0.1:{hooks.port} failed for good" in caplog.text
    assert "s3cret" not in caplog.text and "/down" not in caplog.text


async def test_a_redirect_is_not_followed(hooks: Receiver, make: Any) -> None:
    hooks.state.plan("/moved", Answer(302, {"Location": "http://169.254.169.254/latest"}))
    bb = await make()
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/moved"))
        await asyncio.to_thread(hooks.state.wait_for, "/moved", 2)  # retried, not followed
        await delivered(bb, job.task_id)
    (message,) = await bb.webhooks(job.task_id)
    assert [a.status_code for a in message.attempts] == [302, 204]


async def test_cancelling_a_job_sends_task_cancelled(hooks: Receiver, make: Any) -> None:
    bb = await make()
    job = await bb.enqueue("echo", webhook_url=hooks.url("/cancel"), delay=60)
    async with running_worker(bb):
        await bb.cancel(job.task_id)
        (request,) = await asyncio.to_thread(hooks.state.wait_for, "/cancel", 1)
    body = json.loads(request.body)
    assert (body["type"], body["status"]) == ("task.cancelled", "cancelled")
    assert "result" not in body


async def test_redeliver_sends_the_same_message_again(hooks: Receiver, make: Any) -> None:
    bb = await make()
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/again"))
        await asyncio.to_thread(hooks.state.wait_for, "/again", 1)
        await delivered(bb, job.task_id)
        await bb.redeliver_webhook(job.task_id)
        first, second = await asyncio.to_thread(hooks.state.wait_for, "/again", 2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert first.body == second.body
    (message,) = await bb.webhooks(job.task_id)
    assert len(message.attempts) == 2


async def test_without_a_secret_nothing_is_sent_and_the_log_says_why(
    hooks: Receiver, make: Any
) -> None:
    bb = await make(webhook_secret=None)
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/unsigned"))

        async def tried() -> bool:
            messages = await bb.webhooks(job.task_id)
            return bool(messages) and bool(messages[0].attempts)

        await eventually(tried, message="an attempt")
    (message,) = await bb.webhooks(job.task_id)
    assert (message.attempts[0].error or "").startswith("no webhook secret")  # (no class name)
    assert hooks.state.at("/unsigned") == []


async def test_private_addresses_are_refused_at_enqueue(make: Any) -> None:
    bb = await make(webhook_allow_hosts="")
    for url in ("http://127.0.0.1:9/x", "http://10.0.0.1/x", "http://[::1]/x", "http://0x7f.1/"):
        with pytest.raises(UnsafeURLError):
            await bb.enqueue("echo", webhook_url=url)
    assert (await bb.list()).jobs == []


async def test_a_name_resolving_to_a_private_address_is_refused_when_it_connects(
    make: Any,
) -> None:
    from backburner.webhooks.dispatcher import WebhookDispatcher

    bb = await make(webhook_allow_hosts="")
    job = await bb.enqueue("echo", webhook_url="https://hooks.example.test/in")

    async def private(host: str, port: int) -> list[str]:
        assert host == "hooks.example.test"
        return ["93.184.216.34", "10.0.0.7"]  # one public, one private: refused

    dispatcher = WebhookDispatcher(bb, resolver=private)
    async with running_worker(bb):
        await bb.cancel(job.task_id)
    (message,) = await bb.webhooks(job.task_id)
    attempt, verdict = await dispatcher.attempt(message, "{}")
    assert attempt.status_code is None and "10.0.0.7" in (attempt.error or "")
    assert verdict.status is WebhookStatus.FAILED


async def test_an_address_that_refuses_the_connection_gives_way_to_the_next(
    hooks: Receiver, make: Any
) -> None:
    from backburner.webhooks.dispatcher import WebhookDispatcher

    bb = await make(webhook_allow_hosts="127.0.0.0/8,hooks.example.test")
    job = await bb.enqueue("echo", webhook_url=f"http://hooks.example.test:{hooks.port}/both")

    async def dual_stack(host: str, port: int) -> list[str]:
        # The first is refused (nothing listens there), as an IPv6 address this host cannot
        # reach is: only the first address was ever tried, and every attempt failed.
        return ["127.0.0.2", "127.0.0.1"]

    dispatcher = WebhookDispatcher(bb, resolver=dual_stack)
    async with running_worker(bb):
        await bb.cancel(job.task_id)
    (message,) = await bb.webhooks(job.task_id)
    try:
        result = await dispatcher.attempt(message, "{}")
    finally:
        await dispatcher._receivers.aclose()
    assert result is not None
    attempt, verdict = result
    assert (attempt.status_code, attempt.error) == (204, None)
    assert verdict.status is WebhookStatus.DELIVERED
    (got,) = hooks.state.at("/both")
    assert got.headers["host"] == f"hooks.example.test:{hooks.port}"


async def test_a_job_that_opts_in_also_sends_its_progress(hooks: Receiver, make: Any) -> None:
    bb = await make()
    gate = asyncio.Event()

    @bb.task(max_attempts=1)
    async def steps(ctx: Any) -> str:
        await ctx.progress(25, "a quarter")
        await gate.wait()
        await ctx.progress(75, "three quarters")
        return "done"

    async with running_worker(bb):
        job = await bb.enqueue("steps", webhook_url=hooks.url("/progress"), webhook_progress=True)
        (first,) = await asyncio.to_thread(hooks.state.wait_for, "/progress", 1)
        gate.set()
        requests = await asyncio.to_thread(hooks.state.wait_for, "/progress", 3)
        await delivered(bb, job.task_id)
    bodies = [json.loads(r.body) for r in requests]
    assert bodies[0]["type"] == "task.progress"
    assert bodies[0]["progress"] == {"percent": 25.0, "message": "a quarter"}
    # Deliveries run side by side: the last two may arrive in either order.
    later = {b["type"]: b for b in bodies[1:]}
    assert set(later) == {"task.progress", "task.completed"}
    # A body is made when it is first sent: the progress of that moment (75, or 100 once done).
    assert later["task.progress"]["progress"]["percent"] >= 75.0
    assert later["task.completed"]["result"] == "done"
    assert len({r.headers["webhook-id"] for r in requests}) == 3
    assert first.headers["webhook-id"] == requests[0].headers["webhook-id"]


async def test_a_slow_receiver_gets_the_latest_progress_not_a_backlog(
    hooks: Receiver, make: Any
) -> None:
    # A message claimed but not yet sent counted as sent: each report made another, and a
    # slow receiver got 48 of them (23 alike), with the job's end behind them.
    bb = await make()
    slow, reported, gate = threading.Event(), asyncio.Event(), asyncio.Event()
    hooks.state.plan("/slow", *[Answer(204, hold=slow) for _ in range(40)])

    @bb.task(max_attempts=1)
    async def busy(ctx: Any) -> str:
        for percent in range(1, 31):
            await ctx.progress(percent, f"{percent}%")
            await asyncio.sleep(0.01)
        reported.set()
        await gate.wait()
        return "done"

    try:
        async with running_worker(bb):
            job = await bb.enqueue("busy", webhook_url=hooks.url("/slow"), webhook_progress=True)
            await asyncio.to_thread(hooks.state.wait_for, "/slow", 1)
            await reported.wait()
            slow.set()  # the receiver catches up
            second = await asyncio.to_thread(hooks.state.wait_for, "/slow", 2)
            gate.set()
            await delivered(bb, job.task_id)
    finally:
        slow.set()
    bodies = [json.loads(r.body) for r in hooks.state.at("/slow")]
    progress = [b["progress"]["percent"] for b in bodies if b["type"] == "task.progress"]
    assert len(progress) == 2, progress  # the one on its way, then the latest
    assert progress[-1] == 30.0 and json.loads(second[1].body)["progress"]["percent"] == 30.0
    assert bodies[-1]["type"] == "task.completed"


async def test_progress_webhooks_need_a_webhook_url(make: Any) -> None:
    bb = await make()
    with pytest.raises(InvalidInputError, match="webhook_progress needs a webhook_url"):
        await bb.enqueue("echo", webhook_progress=True)


async def test_an_attempt_is_bounded_as_a_whole_even_by_a_trickling_receiver(
    hooks: Receiver, make: Any
) -> None:
    hooks.state.plan("/slow", Answer(200, body="trickle"))  # a byte every 0.2 s: no read stalls
    bb = await make(webhook_timeout_s=1.0)
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/slow"))

        async def attempted() -> bool:
            messages = await bb.webhooks(job.task_id)
            return bool(messages) and bool(messages[0].attempts)

        await eventually(attempted, message="a first attempt")
    (message,) = await bb.webhooks(job.task_id)
    first = message.attempts[0]
    assert first.error == "timed out after 1 s" and first.latency_ms is not None
    assert first.latency_ms < 2000  # the attempt's own timeout, not one per read


async def test_an_endless_answer_is_not_read_to_the_end(hooks: Receiver, make: Any) -> None:
    hooks.state.plan("/flood", Answer(200, body="endless"))
    bb = await make(webhook_timeout_s=5.0)
    async with running_worker(bb):
        job = await bb.enqueue("echo", webhook_url=hooks.url("/flood"))
        await delivered(bb, job.task_id)
    (message,) = await bb.webhooks(job.task_id)
    assert message.status is WebhookStatus.DELIVERED
    assert (message.attempts[0].latency_ms or 0) < 5000


async def test_an_admin_alert_is_posted_for_each_dead_lettered_job(
    hooks: Receiver, make: Any
) -> None:
    bb = await make(admin_webhook_url=hooks.url("/admin"))
    async with running_worker(bb):
        failed = await bb.enqueue("broken")
        ok = await bb.enqueue("echo")
        (alert,) = await asyncio.to_thread(hooks.state.wait_for, "/admin", 1)
        await bb.wait(ok.task_id, timeout=30)
    verify(SECRET, alert.headers, alert.body)
    body = json.loads(alert.body)
    assert (body["type"], body["task_id"], body["task_type"]) == (
        "task.dead_lettered",
        failed.task_id,
        "broken",
    )
    assert body["error"]["type"] == "ValueError" and body["attempts"] == 1
    assert len(hooks.state.at("/admin")) == 1  # nothing for the job that completed


async def test_a_second_shutdown_cuts_short_the_wait_for_deliveries_in_flight(
    hooks: Receiver, make: Any
) -> None:
    hold = threading.Event()
    hooks.state.plan("/hangs", Answer(204, hold=hold))
    bb = await make(webhook_timeout_s=30.0)  # a stopping worker waits up to 65 s for it
    worker = bb.worker()
    running = asyncio.create_task(worker.run())
    try:
        job = await bb.enqueue("echo", webhook_url=hooks.url("/hangs"))
        await asyncio.to_thread(hooks.state.wait_for, "/hangs", 1)  # in flight, held
        worker.shutdown()
        worker.shutdown()  # at once: its lease ends, and another worker sends it
        await asyncio.wait_for(running, 15)
    finally:
        hold.set()
    (message,) = await bb.webhooks(job.task_id)
    assert message.status is WebhookStatus.PENDING and message.attempts == []


async def test_an_alert_asked_for_once_its_worker_is_closing_it_is_not_sent(
    hooks: Receiver, make: Any
) -> None:
    bb = await make(admin_webhook_url=hooks.url("/admin"))
    failed = await bb.enqueue("broken")
    async with running_worker(bb):
        dead = await bb.wait(failed.task_id, timeout=30)
        await asyncio.to_thread(hooks.state.wait_for, "/admin", 1)
    alerts = DeadLetterAlerts(bb, hooks.url("/admin"))
    await alerts.aclose(1.0)
    # A hook chain's emit that began before the worker removed the hook still calls it.
    await alerts.on_fail(dead)
    assert alerts._sending == set()
    assert len(hooks.state.at("/admin")) == 1  # the worker's own, before


async def test_a_worker_cancelled_while_its_deliveries_drain_cuts_them_short(
    hooks: Receiver, make: Any
) -> None:
    hold = threading.Event()
    hooks.state.plan("/hangs", Answer(204, hold=hold))
    bb = await make(webhook_timeout_s=30.0)
    worker = bb.worker()
    dispatcher, draining = worker.dispatcher, asyncio.Event()
    deliver = dispatcher.run

    async def watched(stopping: asyncio.Event, hurry: asyncio.Event | None = None) -> None:
        async def note() -> None:
            await stopping.wait()
            draining.set()

        noting = asyncio.create_task(note())
        try:
            await deliver(stopping, hurry)
        finally:
            noting.cancel()

    dispatcher.run = watched  # type: ignore[method-assign]
    running = asyncio.create_task(worker.run())
    try:
        job = await bb.enqueue("echo", webhook_url=hooks.url("/hangs"))
        await asyncio.to_thread(hooks.state.wait_for, "/hangs", 1)  # in flight, held
        worker.shutdown()
        await asyncio.wait_for(draining.wait(), 20)  # run() waits for the delivery now
        running.cancel()
        await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 15)
        assert running.cancelled()
        assert dispatcher._inflight == set()  # cut short, not left running on its own
    finally:
        hold.set()
    (message,) = await bb.webhooks(job.task_id)
    assert message.status is WebhookStatus.PENDING and message.attempts == []


async def test_a_receiver_that_hangs_does_not_hold_up_the_others(
    hooks: Receiver, make: Any
) -> None:
    # Each message to it held a dispatcher slot while it waited for one of its connections:
    # a flood to one dead receiver delayed every other receiver's webhooks by 27-57 s.
    hang = threading.Event()
    hooks.state.plan("/hang", *[Answer(204, hold=hang) for _ in range(60)])
    bb = await make(webhook_timeout_s=6.0, webhook_concurrency=20)
    try:
        with receiver() as healthy:
            async with running_worker(bb, concurrency=20):
                for _ in range(60):
                    await bb.enqueue("echo", webhook_url=hooks.url("/hang"))
                await asyncio.to_thread(hooks.state.wait_for, "/hang", 8)  # its connections
                sent = asyncio.get_running_loop().time()
                job = await bb.enqueue("echo", webhook_url=healthy.url("/ok"))
                (got,) = await asyncio.to_thread(healthy.state.wait_for, "/ok", 1)
                waited = asyncio.get_running_loop().time() - sent
                assert json.loads(got.body)["task_id"] == job.task_id
                assert waited < 3.0, waited  # not the 6 s of a slot's wait for a connection
                assert len(hooks.state.at("/hang")) == 8  # never more than its connections
                hang.set()
    finally:
        hang.set()


async def test_a_backlog_to_one_fast_receiver_goes_out_as_fast_as_it_answers(
    hooks: Receiver, make: Any
) -> None:
    # Past a receiver's 16 messages in flight, the rest of a claim was left leased: a burst
    # to one receiver that answers at once went out 16 a lease (17 s here, 35 s by default).
    bb = await make(webhook_timeout_s=6.0, webhook_concurrency=100)
    async with bb:
        for _ in range(150):  # (queued first: they end, and their messages are due, at once)
            await bb.enqueue("echo", webhook_url=hooks.url("/fast"))
        started = asyncio.get_running_loop().time()
        async with running_worker(bb, concurrency=50):
            got = await asyncio.to_thread(hooks.state.wait_for, "/fast", 150, 14.0)
        took = asyncio.get_running_loop().time() - started
    assert len({json.loads(r.body)["task_id"] for r in got}) == 150
    assert took < 14.0  # (before: 16 a lease, 150 in about two minutes)


async def test_an_alert_is_not_sent_unsigned_and_an_attempt_is_bounded_as_a_whole(
    hooks: Receiver, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    unsigned = await make(admin_webhook_url=hooks.url("/plain"), webhook_secret=None)
    async with running_worker(unsigned):
        failed = await unsigned.enqueue("broken")
        await unsigned.wait(failed.task_id, timeout=30)
        await eventually(lambda: "no webhook secret" in caplog.text, message="the alert's warning")
    assert hooks.state.at("/plain") == []  # as for job webhooks: unsigned could be forged
    # A receiver that answers 200 and then sends a byte every 0.2 s kept one attempt open
    # for good (its body was read to the end): only the status matters.
    silent = threading.Event()
    hooks.state.plan("/drip", Answer(200, body="trickle"), Answer(204, hold=silent))
    bb = await make(admin_webhook_url=hooks.url("/drip"), webhook_timeout_s=1.0)
    async with running_worker(bb):
        dead = await bb.wait((await bb.enqueue("broken")).task_id, timeout=30)
        await asyncio.to_thread(hooks.state.wait_for, "/drip", 1)
        (sender,) = [h for h in bb.hooks.hooks if isinstance(h, DeadLetterAlerts)]
        await eventually(lambda: not sender._sending, message="the alert sent")
    assert "dropped: the worker stopped" not in caplog.text
    # One that never answers at all is cut at webhook_timeout_s, and tried again.
    alerts = DeadLetterAlerts(bb, hooks.url("/drip"))
    await alerts.on_fail(dead)
    try:
        await asyncio.to_thread(hooks.state.wait_for, "/drip", 3, 15)
    finally:
        silent.set()
    await alerts.aclose(0.0)
    assert "timed out after 1 s" in caplog.text
