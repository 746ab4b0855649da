"""Fixtures for webhook tests: a receiver on loopback and an app whose webhooks reach it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner
from backburner.webhooks import generate_secret

from ..helpers import WORKER_TEST_SETTINGS
from .receiver import Receiver, receiver

SECRET = generate_secret()
FAST_SCHEDULE = "0,0.2,0.2,0.2,0.2"


@pytest.fixture
def hooks() -> Iterator[Receiver]:
    with receiver() as server:
        yield server


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Any]:
    apps: list[Backburner] = []

    async def build(**settings: Any) -> Backburner:
        base = {
            "backend_url": f"sqlite:///{tmp_path / 'jobs.db'}",
            "webhook_secret": SECRET,
            "webhook_allow_hosts": "127.0.0.0/8",
            "webhook_retry_schedule": FAST_SCHEDULE,
            "webhook_timeout_s": 2.0,
        }
        bb = Backburner(settings=WORKER_TEST_SETTINGS.replace(**{**base, **settings}))

        @bb.task(max_attempts=1)
        async def echo(ctx: Any, value: Any = None) -> Any:
            ctx.add_usage(input_tokens=1, output_tokens=2)
            return {"echo": value}

        @bb.task(max_attempts=1)
        async def broken(ctx: Any) -> None:
            raise ValueError("no good")

        await bb.connect()
        apps.append(bb)
        return bb

    yield build
    for bb in apps:
        await bb.close()
