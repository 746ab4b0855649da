"""Backend URLs: the options a Redis URL may have, the Sentinel and Cluster forms of one, and
any URL with its secrets hidden.

``redis://`` and ``rediss://`` take backburner's options (``prefix``, ``replicas``,
``replica_timeout_ms``) and some of redis-py's (``REDIS_OPTIONS``, and ``TLS_OPTIONS`` for
``rediss://``); anything else is refused before a connection is tried.

``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?options]``
names a Redis primary by the service name its Sentinels monitor (``sentinel monitor <service>
...``); ``rediss+sentinel://`` speaks TLS to the Sentinels and to the primary. The user and
password are the primary's (as in ``redis://``); options: ``prefix`` (the key prefix, as for
``redis://``), ``sentinel_username`` and ``sentinel_password`` (when the Sentinels require
their own), ``ssl_ca_certs`` (a CA file for TLS), ``replicas`` and ``replica_timeout_ms`` (as
for ``redis://``: docs/redis.md). A Sentinel's port defaults to 26379.

``redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0][?options]`` names a Redis
Cluster by some of its nodes (any of them, primaries or replicas: each is asked, in turn, which
node serves the deployment's hash slot); ``rediss+cluster://`` speaks TLS to them. A node's
port defaults to 6379; a Cluster has one database, 0. Options: ``prefix``, ``replicas``,
``replica_timeout_ms``, ``ssl_ca_certs``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigurationError

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
"""The Sentinel schemes, each with whether it speaks TLS."""

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
"""The Cluster schemes, each with whether it speaks TLS."""

SENTINEL_PORT = 26379
REDIS_PORT = 6379
BACKBURNER_OPTIONS = frozenset({"prefix", "replicas", "replica_timeout_ms"})
"""The options of every Redis URL that are backburner's own, not redis-py's."""

CLUSTER_OPTIONS = BACKBURNER_OPTIONS | {"ssl_ca_certs"}
SENTINEL_OPTIONS = BACKBURNER_OPTIONS | {"sentinel_username", "sentinel_password", "ssl_ca_certs"}

REDIS_PY_OPTIONS = frozenset(
    {
        "username",
        "password",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_read_size",
        "client_name",
        "max_connections",
        "retry_on_timeout",
        "health_check_interval",
    }
)
"""The options of redis-py's that a ``redis://`` URL may give it."""

TLS_OPTIONS = frozenset(
    {
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_ciphers",
    }
)
"""redis-py's options of a ``rediss://`` URL (TLS), a client certificate's included."""

_NOT_OURS_TO_SET = {
    "protocol": "backburner reads RESP2 replies itself",
    "decode_responses": "backburner reads replies as bytes itself",
    "db": "the database is the URL's path, as in redis://host:6379/0",
}

_SHOWN_OPTIONS = (
    BACKBURNER_OPTIONS
    | REDIS_PY_OPTIONS
    | TLS_OPTIONS
    | {"sentinel_username", "synchronous", "poll_interval_ms"}
) - {"password", "ssl_password"}
"""Options whose values a URL is shown with; any other's (a password, or an option misspelt,
which may be one) is shown as ``***``."""


@dataclass(frozen=True)
class SentinelAddress:
    """Where a ``redis+sentinel://`` URL points: the Sentinels, the service they monitor, the
    database and the credentials."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False
    ssl_ca_certs: str | None = None

    def describe(self) -> str:
        """For messages: the service and its Sentinels, no secrets."""
        hosts = ",".join(f"{_host_text(host)}:{port}" for host, port in self.sentinels)
        return f"Sentinel service {self.service!r} ({hosts})"


@dataclass(frozen=True)
class ClusterAddress:
    """Where a ``redis+cluster://`` URL points: some nodes of the Cluster, the credentials."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ssl_ca_certs: str | None = None

    def describe(self) -> str:
        """For messages: the nodes named, no secrets."""
        return "Cluster (" + ",".join(f"{_host_text(h)}:{p}" for h, p in self.nodes) + ")"


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterAddress:
    """The ClusterAddress a ``redis+cluster://`` URL names; ConfigurationError, naming what is
    wrong, for one that is not valid."""
    shown = redacted(url)
    what = f"invalid Cluster URL {shown!r}"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None
    credentials, _, hosts_text = parts.netloc.rpartition("@")
    if not hosts_text:
        raise ConfigurationError(f"{what}: name at least one node")
    nodes = tuple(_address(text, what, REDIS_PORT) for text in hosts_text.split(","))
    if parts.path not in ("", "/", "/0"):
        raise ConfigurationError(f"{what}: a Cluster has one database, 0 (the path is /0 or none)")
    options, username, password, tls = _access(
        parts, credentials, CLUSTER_OPTIONS, CLUSTER_SCHEMES, what
    )
    return ClusterAddress(
        nodes=nodes,
        username=username,
        password=password,
        tls=tls,
        ssl_ca_certs=options.get("ssl_ca_certs") or None,
    )


def _options(query: str, known: frozenset[str], what: str) -> dict[str, str]:
    """A URL's options by name; ConfigurationError for an unknown one, or one given twice."""
    pairs = parse_qsl(query, keep_blank_values=True)
    options = dict(pairs)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(
            f"{what}: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    if len(options) < len(pairs):
        twice = sorted(name for name, count in Counter(n for n, _ in pairs).items() if count > 1)
        raise ConfigurationError(f"{what}: option(s) given more than once: {', '.join(twice)}")
    return options


def _access(
    parts: SplitResult,
    credentials: str,
    known: frozenset[str],
    schemes: dict[str, bool],
    what: str,
) -> tuple[dict[str, str], str | None, str | None, bool]:
    """A Sentinel or Cluster URL's options (checked), user name, password and whether it
    speaks TLS (``schemes``: its kind's, each with whether it does)."""
    options = _options(parts.query, known, what)
    username, password = _credentials(credentials)
    tls = schemes[parts.scheme.lower()]
    _check_tls(options, tls, what, next(s for s, secure in schemes.items() if secure))
    return options, username, password, tls


def _check_tls(options: dict[str, str], tls: bool, what: str, scheme: str) -> None:
    """ConfigurationError for a TLS option of a URL without TLS (``scheme``: the one with),
    or for one that names a file that is not there."""
    for name in sorted(TLS_OPTIONS & options.keys()):
        if options[name] and not tls:
            raise ConfigurationError(f"{what}: {name} needs TLS ({scheme}://)")
    for name, (exists, kind) in _FILE_OPTIONS.items():
        path = options.get(name)
        if path and not exists(path):
            raise ConfigurationError(f"{what}: {name}: no such {kind} {path!r}")
    reqs = options.get("ssl_cert_reqs")
    if reqs is not None and reqs not in ("none", "optional", "required"):
        raise ConfigurationError(f"{what}: ssl_cert_reqs is none, optional or required")


def check_redis_url_options(url: str, shown: str) -> None:
    """ConfigurationError unless every option of a ``redis://`` or ``rediss://`` URL is one it
    may have, once (``shown``: the URL without secrets, for the message): a misspelt option
    would otherwise reach redis-py, and fail every connection."""
    parts = urlsplit(url)
    tls = parts.scheme.lower() == "rediss"
    what = f"invalid Redis URL {shown!r}"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if name in _NOT_OURS_TO_SET:
            raise ConfigurationError(f"{what}: {name} cannot be set ({_NOT_OURS_TO_SET[name]})")
    options = _options(parts.query, BACKBURNER_OPTIONS | REDIS_PY_OPTIONS | TLS_OPTIONS, what)
    _check_tls(options, tls, what, "rediss")
    theirs = [(k, v) for k, v in options.items() if k not in BACKBURNER_OPTIONS]
    _check_redis_py_values(urlunsplit(parts._replace(query=urlencode(theirs))), what)


def _check_redis_py_values(url: str, what: str) -> None:
    """ConfigurationError if redis-py cannot read the values of the options it is passed
    (``url``: without backburner's own), or a number is out of its range."""
    from redis.asyncio.connection import parse_url

    try:
        values = parse_url(url)
    except ValueError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None
    for name, least in _LEAST.items():
        value = values.get(name)
        if isinstance(value, int | float) and not (math.isfinite(value) and value >= least):
            bound = "above 0" if least == _ABOVE_ZERO else f"at least {least:g}"
            raise ConfigurationError(f"{what}: {name} must be {bound}")


_ABOVE_ZERO = 1e-9
_LEAST = {
    "socket_timeout": _ABOVE_ZERO,  # (0 would time every command out at once)
    "socket_connect_timeout": _ABOVE_ZERO,
    "health_check_interval": 0,
    "max_connections": 1,
    "socket_read_size": 1,
}
"""The least value of each numeric option redis-py reads from a URL."""


_FILE_OPTIONS: dict[str, tuple[Callable[[str], bool], str]] = {
    "ssl_ca_certs": (os.path.isfile, "file"),
    "ssl_ca_path": (os.path.isdir, "directory"),
    "ssl_certfile": (os.path.isfile, "file"),
    "ssl_keyfile": (os.path.isfile, "file"),
}
"""The TLS options that name a file (or a directory of CA files): one that is not there fails
every connection with a bare "No such file"."""


def _credentials(text: str) -> tuple[str | None, str | None]:
    """The user name and password of a URL's ``user:password`` part (None: not given)."""
    if not text:
        return None, None
    user, has_password, secret = text.partition(":")
    return unquote(user) or None, unquote(secret) if has_password else None


def is_sentinel_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The SentinelAddress a ``redis+sentinel://`` URL names; ConfigurationError, naming what
    is wrong, for one that is not valid."""
    shown = redacted(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # (an unclosed [IPv6 address)
        raise ConfigurationError(f"invalid Sentinel URL {shown!r}: {exc}") from None
    credentials, _, hosts_text = parts.netloc.rpartition("@")
    if not hosts_text:
        raise ConfigurationError(f"invalid Sentinel URL {shown!r}: name at least one Sentinel")
    what = f"invalid Sentinel URL {shown!r}"
    sentinels = tuple(_address(text, what, SENTINEL_PORT) for text in hosts_text.split(","))
    names = [unquote(name) for name in parts.path.split("/")[1:]]
    if not names or not names[0] or len(names) > 2:
        raise ConfigurationError(
            f"invalid Sentinel URL {shown!r}: the path is the service name and an optional "
            "database number, as in redis+sentinel://host:26379/mymaster/0"
        )
    db = 0
    if len(names) == 2:
        if not _number(names[1]):
            raise ConfigurationError(
                f"invalid Sentinel URL {shown!r}: the database {names[1]!r} is not a number"
            )
        db = int(names[1])
    options, username, password, tls = _access(
        parts, credentials, SENTINEL_OPTIONS, SENTINEL_SCHEMES, what
    )
    return SentinelAddress(
        sentinels=sentinels,
        service=names[0],
        db=db,
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        tls=tls,
        ssl_ca_certs=options.get("ssl_ca_certs") or None,
    )


def _address(text: str, what: str, default_port: int) -> tuple[str, int]:
    """One ``host[:port]`` (``[IPv6][:port]``) of a URL's list of hosts."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigurationError(f"{what}: bad address {text!r}")
        port_text = rest[1:] if rest else None
    else:
        host, colon, after = text.partition(":")
        port_text = after if colon else None
    if not host:
        raise ConfigurationError(f"{what}: an address has no host")
    if port_text is None:
        return host, default_port
    if not _number(port_text) or not 0 < int(port_text) < 65536:
        raise ConfigurationError(f"{what}: the port of {host} is not a number in 1..65535")
    return host, int(port_text)


def _number(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits (``str.isdigit`` takes "²" too)."""
    return text.isascii() and text.isdigit()


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


_CLOSED = ("Connection reset by peer", "Connection closed by the server")
"""How redis-py says a server hung up on a new connection (a TLS port it spoke plain text
to, or a plain one whose TLS handshake it could not read, or a missing client certificate)."""


def connection_hint(url: str, failure: str) -> str:
    """A sentence to add to why a first connection to the Redis of ``url`` failed, when the
    URL's scheme or a missing client certificate may be why; else "". Both mistakes show only
    as a hang-up or a timeout: a plain Redis never answers a TLS greeting, and a TLS port
    closes a connection that speaks plain text or brings no certificate it asked for."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    tls = scheme.startswith("rediss")
    other = scheme.replace("rediss", "redis", 1) if tls else scheme.replace("redis", "rediss", 1)
    closed = any(text in failure for text in _CLOSED)
    if tls and "Timeout connecting" in failure:
        return f" If that port does not speak TLS, the URL is {other}://, not {scheme}://."
    refused = closed or "CERTIFICATE_REQUIRED" in failure  # (TLS 1.3's alert, when it comes)
    if scheme == "rediss" and refused and "ssl_certfile" not in dict(parse_qsl(parts.query)):
        return (
            " If that Redis asks for a client certificate, give ssl_certfile and ssl_keyfile"
            " in the URL."
        )
    if not tls and closed:
        return f" If that port speaks only TLS, the URL is {other}://, not {scheme}://."
    return ""


def redacted(url: str) -> str:
    """The URL with its password and secret options shown as ``***`` (to print or log);
    any URL, valid or not. Everything before its last ``@`` but the user name counts as the
    password: a password with an unescaped ``/``, ``?`` or ``#`` is hidden too (and an ``@``
    in the query makes it hide more than it must, never less)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    credentials, at, after = rest.rpartition("@")
    if at and ":" in credentials:
        rest = credentials.partition(":")[0] + ":***@" + after
    where, question, query = rest.partition("?")
    if not question:
        return scheme + separator + rest
    shown = []
    for option in query.split("&"):
        name, equals, _ = option.partition("=")
        shown.append(option if not equals or name in _SHOWN_OPTIONS else f"{name}=***")
    return scheme + separator + where + "?" + "&".join(shown)
