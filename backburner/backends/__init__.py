"""Storage backends behind one contract (``Backend``), chosen by URL."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigurationError
from .base import Backend, Complete, Fail, NewJob, Outcome, Page, Release, RetryAt, Stats

__all__ = [
    "Backend",
    "Complete",
    "Fail",
    "NewJob",
    "Outcome",
    "Page",
    "Release",
    "RetryAt",
    "Stats",
    "backend_from_url",
]

_SQLITE_OPTIONS = {"synchronous", "poll_interval_ms"}


def backend_from_url(url: str, *, max_queue_size: int | None = None) -> Backend:
    """Make a backend from a URL: ``sqlite:///path.db``, ``memory://``.

    Engines are imported lazily, so a URL names only what it needs installed.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        from .memory import MemoryBackend

        return MemoryBackend(max_queue_size=max_queue_size)
    if scheme == "sqlite":
        from .sqlite import SQLiteBackend

        if parts.netloc:
            raise ConfigurationError(
                f"invalid SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs/path.db"
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path or path == ":memory:":
            raise ConfigurationError(
                f"invalid SQLite URL {url!r}: give a file path (other processes must open it)"
            )
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - _SQLITE_OPTIONS
        if unknown:
            raise ConfigurationError(f"unknown SQLite URL option(s): {', '.join(sorted(unknown))}")
        try:
            poll_ms = float(options.get("poll_interval_ms", "2"))
        except ValueError:
            raise ConfigurationError("poll_interval_ms must be a number") from None
        if not 0.1 <= poll_ms <= 10_000:  # also refuses NaN
            raise ConfigurationError("poll_interval_ms must be within 0.1 .. 10000")
        return SQLiteBackend(
            path,
            max_queue_size=max_queue_size,
            synchronous=options.get("synchronous", "NORMAL"),
            poll_interval_s=poll_ms / 1000,
        )
    if scheme in ("redis", "rediss", "postgresql", "postgres"):
        raise ConfigurationError(f"the {scheme}:// backend is not available yet")
    raise ConfigurationError(
        f"unknown backend URL {url!r}: expected sqlite:///path.db or memory://"
    )
