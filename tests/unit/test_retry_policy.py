"""Backoff with full jitter and a cap; classification of errors into retry or fail."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from backburner.backends.base import Fail, RetryAt
from backburner.errors import PermanentError, Retry
from backburner.models import ErrorInfo, Job, JobStatus
from backburner.tasks import TaskDefinition
from backburner.worker.retry import RetryPolicy


def job(**changes: object) -> Job:
    base = {
        "task_id": "t",
        "type": "x",
        "status": JobStatus.PROCESSING,
        "created_at": 0.0,
        "run_at": 0.0,
        "attempts": 1,
        "max_attempts": 3,
    }
    return Job.model_validate({**base, **changes})


@given(
    attempt=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=10),
    cap=st.floats(min_value=0.01, max_value=1000),
    seed=st.integers(),
)
def test_backoff_stays_within_the_jitter_bounds(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    policy = RetryPolicy(base_s=base, cap_s=cap)
    delay = policy.backoff(attempt, random.Random(seed))
    assert 0.0 <= delay <= min(cap, base * 2 ** (attempt - 1))


def test_backoff_spreads_over_the_whole_window() -> None:
    policy = RetryPolicy(base_s=1.0, cap_s=300.0)
    rng = random.Random(7)
    delays = [policy.backoff(4, rng) for _ in range(2000)]
    assert max(delays) <= 8.0
    # Full jitter: uniform over [0, 8], so both ends of the window are used.
    assert min(delays) < 0.5 and max(delays) > 7.5
    assert 3.5 < sum(delays) / len(delays) < 4.5


def test_cap_bounds_late_attempts() -> None:
    policy = RetryPolicy(base_s=1.0, cap_s=30.0)
    rng = random.Random(1)
    assert max(policy.backoff(50, rng) for _ in range(500)) <= 30.0


async def _handler(ctx: object) -> None:
    return None


def test_classify() -> None:
    policy = RetryPolicy()
    task = TaskDefinition(
        name="t", handler=_handler, permanent_on=(KeyError,), retry_on=(ConnectionError, KeyError)
    )
    assert policy.classify(Retry("slow down", after=7), task) == (
        ErrorInfo(type="retry", message="slow down", retryable=True),
        7,
    )
    error, delay = policy.classify(PermanentError("bad"), task)
    assert (error.type, error.retryable, delay) == ("PermanentError", False, None)
    assert policy.classify(TimeoutError(), task)[0].type == "timeout"
    assert policy.classify(ConnectionError("x"), task)[0].retryable is True
    assert policy.classify(KeyError("k"), task)[0].retryable is False  # permanent wins
    assert policy.classify(ValueError("v"), task)[0].retryable is False  # not in retry_on


def test_after_failure_respects_budget_delay_and_deadline() -> None:
    policy = RetryPolicy(base_s=1.0, cap_s=10.0, dead_letter_ttl_s=100.0)
    retryable = ErrorInfo(type="E", message="m", retryable=True)
    outcome = policy.after_failure(job(attempts=1), retryable, 5.0, now=1000.0)
    assert outcome == RetryAt(retryable, 1005.0)
    spent = policy.after_failure(job(attempts=3), retryable, None, now=1000.0)
    assert isinstance(spent, Fail) and "gave up after 3 attempts" in spent.error.message
    assert spent.ttl_s == 86400.0  # the job's ttl is longer than the DLQ retention here
    permanent = ErrorInfo(type="E", message="m", retryable=False)
    assert isinstance(policy.after_failure(job(), permanent, None, now=0.0), Fail)
    late = policy.after_failure(job(deadline_at=1003.0), retryable, 5.0, now=1000.0)
    assert isinstance(late, Fail) and late.error.type == "deadline_exceeded"
