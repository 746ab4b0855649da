"""Settings and enqueue refuse what would make a webhook undeliverable, before anything runs."""

from __future__ import annotations

import pytest

from backburner import Backburner, Settings
from backburner.errors import ConfigurationError, UnsafeURLError


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
