"""Sentinel and Cluster URLs are read into what they name or refused with what is wrong; any
backend URL is printed without its secrets."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from backburner import Backburner
from backburner.backends.redis import RedisBackend
from backburner.backends.redis_cluster import moved_to
from backburner.backends.urls import (
    ClusterAddress,
    SentinelAddress,
    connection_hint,
    parse_cluster_url,
    parse_sentinel_url,
    redacted,
)
from backburner.errors import ConfigurationError

from .test_cli import assert_one_line_error, run


@pytest.fixture
def ca_file(tmp_path: Path) -> str:
    """A file to name as a CA bundle (only its existence is checked before connecting)."""
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(path)


def test_a_sentinel_url_names_sentinels_service_database_and_credentials(ca_file: str) -> None:
    address = parse_sentinel_url(
        "rediss+sentinel://app:p%40ss@s1,s2:26380,[::1]:26381/main%20cache/3"
        f"?sentinel_username=sen&sentinel_password=sp&ssl_ca_certs={ca_file}&prefix=x"
    )
    assert address == SentinelAddress(
        sentinels=(("s1", 26379), ("s2", 26380), ("::1", 26381)),
        service="main cache",
        db=3,
        username="app",
        password="p@ss",
        sentinel_username="sen",
        sentinel_password="sp",
        tls=True,
        ssl_ca_certs=ca_file,
    )
    assert address.describe() == "Sentinel service 'main cache' (s1:26379,s2:26380,[::1]:26381)"


def test_a_sentinel_url_without_credentials_or_database() -> None:
    address = parse_sentinel_url("redis+sentinel://10.0.0.5/mymaster")
    assert address == SentinelAddress(sentinels=(("10.0.0.5", 26379),), service="mymaster")
    assert parse_sentinel_url("redis+sentinel://:secret@h/m/0").password == "secret"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel:///mymaster", "name at least one Sentinel"),
        ("redis+sentinel://h", "the path is the service name"),
        ("redis+sentinel://h/", "the path is the service name"),
        ("redis+sentinel://h/m/0/extra", "the path is the service name"),
        ("redis+sentinel://h/m/zero", "the database 'zero' is not a number"),
        ("redis+sentinel://h:0/m", "not a number in 1..65535"),
        ("redis+sentinel://h:99999/m", "not a number in 1..65535"),
        ("redis+sentinel://h:port/m", "not a number in 1..65535"),
        ("redis+sentinel://h,/m", "an address has no host"),
        ("redis+sentinel://[::1/m", "Invalid IPv6 URL"),
        ("redis+sentinel://[::1]x/m", "bad address"),
        ("redis+sentinel://h/m?socket_timeout=1", "unknown option(s) socket_timeout"),
        ("redis+sentinel://h/m?ssl_ca_certs=/ca.pem", "needs TLS (rediss+sentinel://)"),
        ("redis+sentinel://h/m?prefix=a&prefix=b", "given more than once: prefix"),
        ("rediss+sentinel://h/m?ssl_ca_certs=/no/ca.pem", "ssl_ca_certs: no such file"),
        ("redis+sentinel://h/m?prefix=a{b}", "prefix"),
        ("redis+sentinel://h/m/\u00b2", "is not a number"),
        ("redis+sentinel://h:\u00b2/m", "not a number in 1..65535"),
        ("redis+sentinel://h/m?replicas=-1", "replicas must be a whole number"),
    ],
)
def test_a_sentinel_url_that_is_not_valid_is_refused_at_once(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=f"invalid .*{re.escape(message)}"):
        Backburner(url)


def test_the_sentinel_backend_keeps_its_prefix_and_connects_nowhere_yet() -> None:
    bb = Backburner("redis+sentinel://127.0.0.1:9,127.0.0.1:10/svc/2?prefix=orders")
    assert isinstance(bb.backend, RedisBackend)
    assert bb.backend.prefix == "orders"
    assert "prefix" not in bb.backend.url


def test_a_cluster_url_names_nodes_and_credentials(ca_file: str) -> None:
    address = parse_cluster_url(
        f"rediss+cluster://app:p%40ss@n1,n2:7001,[::1]:7002/0?ssl_ca_certs={ca_file}&prefix=x"
    )
    assert address == ClusterAddress(
        nodes=(("n1", 6379), ("n2", 7001), ("::1", 7002)),
        username="app",
        password="p@ss",
        tls=True,
        ssl_ca_certs=ca_file,
    )
    assert address.describe() == "Cluster (n1:6379,n2:7001,[::1]:7002)"
    assert parse_cluster_url("redis+cluster://10.0.0.5") == ClusterAddress((("10.0.0.5", 6379),))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://", "name at least one node"),
        ("redis+cluster:///0", "name at least one node"),
        ("redis+cluster://h/1", "one database, 0"),
        ("redis+cluster://h/0/x", "one database, 0"),
        ("redis+cluster://h:0", "not a number in 1..65535"),
        ("redis+cluster://h,", "an address has no host"),
        ("redis+cluster://h?socket_timeout=1", "unknown option(s) socket_timeout"),
        ("redis+cluster://h?ssl_ca_certs=/ca.pem", "needs TLS (rediss+cluster://)"),
        ("rediss+cluster://h?ssl_ca_certs=/no/ca.pem", "ssl_ca_certs: no such file"),
        ("redis+cluster://h?prefix=a{b}", "prefix"),
        ("redis+cluster://h?replicas=x", "replicas must be a whole number"),
    ],
)
def test_a_cluster_url_that_is_not_valid_is_refused_at_once(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=f"invalid .*{re.escape(message)}"):
        Backburner(url)


def test_the_cluster_backend_keeps_its_options_and_connects_nowhere_yet() -> None:
    bb = Backburner("redis+cluster://127.0.0.1:9,127.0.0.1:10?prefix=orders&replicas=1")
    assert isinstance(bb.backend, RedisBackend)
    assert (bb.backend.prefix, bb.backend.replicas) == ("orders", 1)
    assert bb.backend.url == "redis+cluster://127.0.0.1:9,127.0.0.1:10"


@pytest.mark.parametrize(
    ("message", "node"),
    [
        ("MOVED 8620 127.0.0.1:7102", ("127.0.0.1", 7102)),
        ("MOVED 1 [::1]:7000", ("::1", 7000)),
        ("MOVED 1 :7000", ("", 7000)),  # a node that does not know its address
        ("MOVED 1 host", None),
        ("ASK 1 h:1", None),
        ("READONLY You can't write against a read only replica.", None),
    ],
)
def test_a_moved_reply_names_the_node_serving_the_slot(
    message: str, node: tuple[str, int] | None
) -> None:
    assert moved_to(message) == node


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:secret@host/0?prefix=x", "redis://user:***@host/0?prefix=x"),
        ("rediss://user@host/0", "rediss://user@host/0"),
        (
            "redis+sentinel://u:p%40ss@h1,h2/m/0?sentinel_password=sp&prefix=x",
            "redis+sentinel://u:***@h1,h2/m/0?sentinel_password=***&prefix=x",
        ),
        ("redis+cluster://u:pw@h1,h2:7000?prefix=x", "redis+cluster://u:***@h1,h2:7000?prefix=x"),
        ("redis://host/0?password=pw", "redis://host/0?password=***"),
        ("redis://host/0?password=a#b&x=1", "redis://host/0?password=***&x=***"),
        ("rediss://h/0?ssl_pasword=pw&prefix=p", "rediss://h/0?ssl_pasword=***&prefix=p"),
        (
            "redis+sentinel://h/m?sentinel_pasword=sp&sentinel_username=s",
            "redis+sentinel://h/m?sentinel_pasword=***&sentinel_username=s",
        ),
        (
            "redis://h/0?socket_timeout=2&client_name=w1",
            "redis://h/0?socket_timeout=2&client_name=w1",
        ),
        ("rediss://host/0?ssl_password=key", "rediss://host/0?ssl_password=***"),
        ("redis://:pa/ss@host/0", "redis://:***@host/0"),  # (not escaped: hidden all the same)
        ("redis://u:p?w#d@host:1/0", "redis://u:***@host:1/0"),
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("sqlite:////abs/x.db?synchronous=FULL", "sqlite:////abs/x.db?synchronous=FULL"),
        ("memory://", "memory://"),
        ("not a url", "not a url"),
    ],
)
def test_a_url_is_shown_without_its_secrets(url: str, shown: str) -> None:
    assert redacted(url) == shown


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h/\u00b2", "database number"),
        ("redis://h/0?replicas=\u00b2", "replicas must be a whole number >= 0"),
        ("redis://h/0?replicas=x", "replicas must be a whole number >= 0"),
        ("redis://h/0?replica_timeout_ms=0", "replica_timeout_ms must be a whole number >= 1"),
        ("redis://:pa/ss@h/zero", "database number"),
        ("redis://h/0?prefx=a", "unknown option(s) prefx"),
        ("redis://h/0?socket_timeout=abc", "Invalid value for 'socket_timeout'"),
        ("redis://h/0?max_connections=x", "Invalid value for 'max_connections'"),
        ("redis://h/0?ssl_ca_certs=/ca.pem", "ssl_ca_certs needs TLS (rediss://)"),
        ("rediss://h/0?ssl_ca_certs=/no/ca.pem", "ssl_ca_certs: no such file '/no/ca.pem'"),
        ("rediss://h/0?ssl_certfile=/no/c.pem", "ssl_certfile: no such file '/no/c.pem'"),
        ("rediss://h/0?ssl_keyfile=/no/k.pem", "ssl_keyfile: no such file '/no/k.pem'"),
        ("rediss://u:pw@h/0?ssl_password=pa/ss&x=1", "unknown option(s) x"),
        ("redis://h/0?protocol=3", "protocol cannot be set (backburner reads RESP2"),
        ("redis://h/0?decode_responses=true", "decode_responses cannot be set"),
        ("redis://h/0?db=2", "db cannot be set (the database is the URL's path"),
        ("redis://h/0?socket_timeout=-5", "socket_timeout must be above 0"),
        ("redis://h/0?socket_timeout=nan", "socket_timeout must be above 0"),
        ("redis://h/0?socket_timeout=0", "socket_timeout must be above 0"),
        ("redis://h/0?max_connections=0", "max_connections must be at least 1"),
        ("redis://h/0?prefix=a&prefix=b", "option(s) given more than once: prefix"),
        ("rediss://h/0?ssl_ca_path=/no/cas", "ssl_ca_path: no such directory '/no/cas'"),
        ("rediss://h/0?ssl_cert_reqs=bogus", "ssl_cert_reqs is none, optional or required"),
        ("rediss://h/0?ssl_pasword=pa/ss", "unknown option(s) ssl_pasword"),
    ],
)
def test_a_redis_url_with_a_bad_option_is_refused_without_its_password(
    url: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)) as refused:
        Backburner(url)
    assert "pa/ss" not in str(refused.value)


def test_redis_pys_own_options_reach_it(ca_file: str) -> None:
    url = (
        f"rediss://h:6380/1?ssl_ca_certs={ca_file}&ssl_certfile={ca_file}&ssl_keyfile={ca_file}"
        "&ssl_cert_reqs=required&ssl_check_hostname=true&socket_connect_timeout=2&client_name=w"
        "&username=app&password=pw&socket_read_size=65536"
    )
    bb = Backburner(url + "&prefix=p")
    assert isinstance(bb.backend, RedisBackend)
    passed = urlsplit(bb.backend.url)
    assert passed.netloc == "h:6380" and passed.path == "/1"
    assert parse_qsl(passed.query) == parse_qsl(urlsplit(url).query)


def test_the_replica_options_reach_the_backend_and_not_redis_py() -> None:
    bb = Backburner("redis://h/0?replicas=2&replica_timeout_ms=250&socket_timeout=3")
    assert isinstance(bb.backend, RedisBackend)
    assert (bb.backend.replicas, bb.backend.replica_timeout_ms) == (2, 250)
    assert bb.backend.url == "redis://h/0?socket_timeout=3"


def test_the_cli_refuses_a_bad_sentinel_url_in_one_line_without_its_password() -> None:
    done = run("worker", "--backend", "redis+sentinel://:hunter2@h:99999/m")
    assert_one_line_error(done, "not a number in 1..65535")
    assert "hunter2" not in done.stderr


RESET = "Error while reading from 127.0.0.1:6380 : (104, 'Connection reset by peer')"
CLOSED = "Connection closed by the server before write"
ALERT = "(1, '[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required')"


@pytest.mark.parametrize(
    ("url", "failure", "hint"),
    [
        ("rediss://h:6379/0", "Timeout connecting to server", "the URL is redis://, not rediss://"),
        ("redis://h:6380/0", RESET, "the URL is rediss://, not redis://"),
        ("redis+cluster://h:6380", CLOSED, "the URL is rediss+cluster://, not redis+cluster://"),
        ("rediss+sentinel://h/m", "Timeout connecting", "is redis+sentinel://, not rediss+"),
        ("rediss://h:6380/0", CLOSED, "give ssl_certfile and ssl_keyfile"),
        ("rediss://h:6380/0", ALERT, "give ssl_certfile and ssl_keyfile"),
        ("rediss+sentinel://h/mymaster", RESET, None),  # (it takes no client certificate)
        ("rediss://h:6380/0?ssl_certfile=/c.pem&ssl_keyfile=/k.pem", CLOSED, None),
        ("redis://h:6379/0", "Timeout connecting to server", None),
        ("rediss://h:6379/0", "Error 111 connecting to h:6379. Connection refused.", None),
        ("redis://h:6379/0", "Error 111 connecting to h:6379. Connection refused.", None),
    ],
)
def test_a_failed_connection_hints_at_the_scheme_or_a_client_certificate(
    url: str, failure: str, hint: str | None
) -> None:
    said = connection_hint(url, failure)
    if hint is None:
        assert said == ""
    else:
        assert hint in said and said.startswith(" ") and said.endswith(".")
