"""The pure timing rules: retries, Retry-After, poll pacing, reconnect pacing."""

from __future__ import annotations

import email.utils

import pytest

from backburner.client import RetryPolicy
from backburner.client._policy import parse_retry_after, poll_delay, reconnect_backoff


def test_retry_only_idempotent_requests() -> None:
    policy = RetryPolicy(max_retries=3, backoff_s=0.5, max_backoff_s=8)
    assert policy.delay(0, idempotent=False) is None
    assert policy.delay(0, idempotent=False, status=503) is None
    assert policy.delay(0, idempotent=True) == 0.5


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_retry_passing_failures(status: int) -> None:
    policy = RetryPolicy(max_retries=3, backoff_s=0.5, max_backoff_s=1.5)
    assert [policy.delay(n, idempotent=True, status=status) for n in range(4)] == [
        0.5,
        1.0,
        1.5,
        None,
    ]


@pytest.mark.parametrize("status", [200, 400, 401, 404, 409, 413, 422, 500, 501])
def test_never_retry_other_answers(status: int) -> None:
    assert RetryPolicy().delay(0, idempotent=True, status=status) is None


def test_retry_after_is_honoured_within_bounds() -> None:
    policy = RetryPolicy(backoff_s=0.5, max_retry_after_s=10)
    assert policy.delay(0, idempotent=True, status=429, retry_after=7) == 7
    assert policy.delay(0, idempotent=True, status=503, retry_after=0.1) == 0.1
    assert policy.delay(0, idempotent=True, status=503, retry_after=11) is None  # too long


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after(" 5 ") == 5.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("nan") is None
    assert parse_retry_after("inf") is None
    assert parse_retry_after("soon") is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == 30.0


def test_poll_delay_backs_off_and_the_hint_is_a_floor() -> None:
    delays = [poll_delay(n, None, interval=1, max_interval=30) for n in range(8)]
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert poll_delay(0, 5, interval=1, max_interval=30) == 5  # longer than the backoff
    assert poll_delay(4, 1, interval=1, max_interval=30) == 16  # shorter than the backoff
    assert poll_delay(10_000, None, interval=1, max_interval=30) == 30


def test_reconnect_backoff() -> None:
    assert reconnect_backoff(0, 1000, base=0.5, max_delay=5) == 0  # it made progress
    assert [reconnect_backoff(n, None, base=0.5, max_delay=3) for n in (1, 2, 3, 4)] == [
        0.5,
        1,
        2,
        3,
    ]
    assert reconnect_backoff(1, 250, base=0.5, max_delay=3) == 0.25  # the server's retry: field


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError):
        RetryPolicy(backoff_s=-1)
