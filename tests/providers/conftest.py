"""Fixtures for provider tests: the fake OpenAI server, and models routed to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fake_openai import FakeOpenAI, fake_openai


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with fake_openai() as server:
        yield server
