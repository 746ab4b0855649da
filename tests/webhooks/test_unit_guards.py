"""Settings and enqueue refuse what would make a webhook undeliverable, before anything runs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from backburner import Backburner, Settings
from backburner.errors import BackendConnectionError, ConfigurationError, UnsafeURLError
from backburner.models import WebhookAttempt, WebhookDelivery, WebhookStatus
from backburner.providers.base import parse_retry_after
from backburner.webhooks import dispatcher as dispatcher_module
from backburner.webhooks import generate_secret
from backburner.webhooks.dispatcher import LONGEST_RETRY_AFTER_S, WebhookDispatcher


@pytest.mark.parametrize("secret", ["whsec_nope!", "whsec_" + "A" * 8, "not base64 at all %%"])
def test_a_malformed_secret_fails_at_start_without_echoing_it(secret: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings(webhook_secret=secret)
    assert secret not in str(caught.value)


@pytest.mark.parametrize("schedule", ["", "5,10", "0,-1", "0,x", "0,inf"])
def test_a_bad_retry_schedule_fails_at_start(schedule: str) -> None:
    with pytest.raises(ConfigurationError, match="webhook_retry_schedule"):
        Settings(webhook_retry_schedule=schedule)


async def test_an_overlong_webhook_url_is_refused_at_enqueue() -> None:
    bb = Backburner("memory://", settings=Settings(backend_url="memory://"))

    @bb.task
    async def noop(ctx: object) -> None:
        return None

    with pytest.raises(UnsafeURLError, match="longer than 2048"):
        await bb.enqueue("noop", webhook_url="https://example.com/" + "a" * 3000)


async def test_a_job_with_a_webhook_is_kept_until_its_last_retry() -> None:
    settings = Settings(backend_url="memory://", webhook_retry_schedule="0,100,100")
    bb = Backburner("memory://", settings=settings)

    @bb.task
    async def noop(ctx: object) -> None:
        return None

    job = await bb.enqueue("noop", webhook_url="https://example.com/h", ttl=10)
    assert job.ttl_s == pytest.approx(200 * 1.1 + 3600)
    plain = await bb.enqueue("noop", ttl=10)
    assert plain.ttl_s == 10


@pytest.mark.parametrize(
    ("header", "at_least", "at_most"),
    [
        ("0", 270.0, 330.0),  # the schedule's 300 s (±10%): "0" does not burn the schedule
        ("7200", 7200.0, 7200.0),  # two hours, as asked (a provider's cap is one hour)
        ("999999", 86400.0, 86400.0),  # at most a day
    ],
)
def test_retry_after_is_waited_for_but_never_less_than_the_schedule(
    header: str, at_least: float, at_most: float
) -> None:
    settings = Settings(webhook_secret=generate_secret(), webhook_retry_schedule="0,5,300,1800")
    dispatcher = WebhookDispatcher(Backburner(settings=settings))
    message = WebhookDelivery(
        msg_id="msg_1",
        task_id="task_1",
        event="task.completed",
        url="https://example.com/h",
        status=WebhookStatus.PENDING,
        created_at=0.0,
        next_at=0.0,
        tries=1,
    )
    attempt = WebhookAttempt(at=1000.0, status_code=503, latency_ms=0.0, error="HTTP 503")
    wait = parse_retry_after(header, longest=LONGEST_RETRY_AFTER_S)
    verdict = dispatcher.verdict(message, attempt, wait)
    assert verdict.status is WebhookStatus.PENDING and verdict.next_at is not None
    assert at_least <= verdict.next_at - 1000.0 <= at_most


async def test_a_dispatcher_whose_backend_is_down_says_so_once_a_streak(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # It logged a warning at every failed claim, twice a second through an outage.
    monkeypatch.setattr(dispatcher_module, "POLL_S", 0.0)
    settings = Settings(webhook_secret=generate_secret())
    bb = Backburner("memory://", settings=settings)
    dispatcher = WebhookDispatcher(bb)
    stopping = asyncio.Event()
    calls = 0

    async def down(**_: Any) -> list[WebhookDelivery]:
        nonlocal calls
        calls += 1
        if calls == 150:
            stopping.set()
        raise BackendConnectionError("Redis at 127.0.0.1:1: connection refused")

    monkeypatch.setattr(bb.backend, "claim_webhooks", down)
    with caplog.at_level(logging.WARNING, logger="backburner.webhooks"):
        await asyncio.wait_for(dispatcher.run(stopping), 30)
    said = [r.getMessage() for r in caplog.records if "cannot claim" in r.getMessage()]
    assert calls == 150 and len(said) == 2, said  # the 1st and the 100th
    assert "100 in a row" in said[1]
