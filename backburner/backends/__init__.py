"""Storage backends behind one contract (``Backend``), chosen by URL."""

from __future__ import annotations

from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigurationError, MissingDependencyError
from .base import Backend, Complete, Fail, NewJob, Outcome, Page, Release, RetryAt, Stats
from .urls import (
    BACKBURNER_OPTIONS,
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    check_redis_url_options,
    parse_cluster_url,
    parse_sentinel_url,
    redacted,
)

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
    """Make a backend from a URL: ``sqlite:///path.db``, ``redis://host:6379/0``,
    ``redis+sentinel://host:26379/service/0``, ``redis+cluster://host:6379,host2:6379``
    (backends/urls.py), ``memory://``.

    Engines are imported lazily, so a URL names only what it needs installed.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # (an unclosed [IPv6 address)
        raise ConfigurationError(f"invalid backend URL {redacted(url)!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme == "memory":
        from .memory import MemoryBackend

        return MemoryBackend(max_queue_size=max_queue_size)
    if scheme == "sqlite":
        from .sqlite import SQLiteBackend

        # (sqlite:/x.db parses as sqlite:///x.db, but reads as an absolute path: refused)
        if parts.netloc or not url[len(parts.scheme) + 1 :].startswith("//"):
            raise ConfigurationError(
                f"invalid SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs/path.db"
            )
        if parts.fragment or url.endswith("#"):  # (everything after a '#' was dropped)
            raise ConfigurationError(
                f"invalid SQLite URL {url!r}: a '#' ends the path; write it as %23"
            )
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
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
    if scheme in ("redis", "rediss", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES):
        return _redis_backend(url, max_queue_size)
    if scheme in ("postgresql", "postgres"):
        raise ConfigurationError(f"the {scheme}:// backend is not available yet")
    raise ConfigurationError(
        f"unknown backend URL {redacted(url)!r}: expected sqlite:///path.db, "
        "redis://host:6379/0, redis+sentinel://host:26379/service/0, "
        "redis+cluster://host:6379 or memory://"
    )


def _redis_backend(url: str, max_queue_size: int | None) -> Backend:
    try:
        import redis  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            "the redis:// backend needs redis-py: pip install 'backburner[redis]'"
        ) from None
    from .redis import RedisBackend

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {key: value for key, value in query if key in BACKBURNER_OPTIONS}
    rest = urlencode([(key, value) for key, value in query if key not in BACKBURNER_OPTIONS])
    replicas = _count(ours.get("replicas", "0"), "replicas", url, minimum=0)
    timeout_ms = _count(ours.get("replica_timeout_ms", "1000"), "replica_timeout_ms", url)
    if parts.scheme.lower() in SENTINEL_SCHEMES:
        parse_sentinel_url(url)  # a URL that is not valid is refused here, not at connect()
    elif parts.scheme.lower() in CLUSTER_SCHEMES:
        parse_cluster_url(url)
    else:
        if parts.path not in ("", "/") and not _whole(parts.path[1:]):
            raise ConfigurationError(
                f"invalid Redis URL {redacted(url)!r}: the path is a database number, as in "
                "redis://host:6379/0"
            )
        check_redis_url_options(url, redacted(url))
    return RedisBackend(
        urlunsplit(parts._replace(query=rest)),
        prefix=ours.get("prefix", "bb"),
        max_queue_size=max_queue_size,
        replicas=replicas,
        replica_timeout_ms=timeout_ms,
    )


def _whole(text: str) -> bool:
    return text.isascii() and text.isdigit()  # (str.isdigit takes "²" too)


def _count(text: str, name: str, url: str, *, minimum: int = 1) -> int:
    if not _whole(text) or int(text) < minimum:
        raise ConfigurationError(
            f"invalid Redis URL {redacted(url)!r}: {name} must be a whole number >= {minimum}"
        )
    return int(text)
