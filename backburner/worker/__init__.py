"""The worker runtime: claim loop, leases, timeouts, retries, cancellation, shutdown."""

from .retry import RetryPolicy
from .runner import Worker

__all__ = ["RetryPolicy", "Worker"]
