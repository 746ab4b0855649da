"""The webhook SSRF guard: static URL checks, vetted resolution, pinned requests.

DNS is always faked through the injectable resolver; the only traffic is to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from backburner.errors import InvalidInputError, UnsafeURLError
from backburner.webhooks.ssrf import (
    ParsedTarget,
    Resolver,
    check_url,
    is_unsafe,
    pinned_request_args,
    resolve_safe,
)

REFUSED = [
    "http://127.0.0.1/",
    "http://localhost/",
    "http://LOCALHOST./",
    "http://foo.localhost/",
    "http://printer.local/",
    "http://metadata.google.internal/",
    "http://10.1.2.3/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data",
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "http://0/",
    "http://[::1]/",
    "http://[::]/",
    "http://[fd00::1]/",
    "http://[fe80::1]/",
    "http://[fec0::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[64:ff9b::a00:1]/",
    "http://[2002:7f00:1::]/",
    "http://[::127.0.0.1]/",
    "http://[2001:db8::1]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://255.255.255.255/",
    "http://240.0.0.1/",
    "http://198.18.0.1/",
    "http://192.0.2.1/",
    "http://2130706433/",
    "http://0177.0.0.1/",
    "http://0x7f.0.0.1/",
    "http://0x7f000001/",
    "http://127.1/",
    "http://127.0.0.1./",
    "http://1.2.3.4.5/",
    "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/",  # full-width 127.0.0.1: IDNA maps it
    "ftp://example.com/",
    "file:///etc/passwd",
    "gopher://x/",
    "example.com/hook",
    "http://user:pass@example.com/",
    "http://@example.com/",
    "http://example.com\\@127.0.0.1/",
    "http:///nohost",
    "http://example.com:0/",
    "http://example.com:65536/",
    "http://example.com:8o/",
    "http://[::1/",
    "http://::1/",
    "http://[fe80::1%25eth0]/",
    "http://exa mple.com/",
    "http://example.com/\nx",
    "http://127.0.0.%31/",
]

ACCEPTED = [
    ("https://example.com/hook", ParsedTarget("https", "example.com", 443, "/hook")),
    (
        "http://93.184.216.34:8080/x",
        ParsedTarget("http", "93.184.216.34", 8080, "/x", ipaddress.ip_address("93.184.216.34")),
    ),
    (
        "https://[2606:4700::1111]/",
        ParsedTarget("https", "2606:4700::1111", 443, "/", ipaddress.ip_address("2606:4700::1111")),
    ),
    ("HTTPS://Hooks.Example.COM:8443", ParsedTarget("https", "hooks.example.com", 8443, "/")),
    (
        "http://example.com/a/b?x=1&y=2#frag",
        ParsedTarget("http", "example.com", 80, "/a/b?x=1&y=2"),
    ),
    ("https://bücher.example/h", ParsedTarget("https", "xn--bcher-kva.example", 443, "/h")),
    ("http://example.com:/", ParsedTarget("http", "example.com", 80, "/")),
]


def fake_resolver(table: dict[str, list[str]]) -> tuple[Resolver, list[tuple[str, int]]]:
    """A resolver answering from ``table`` (a missing name fails like DNS), and its call log."""
    calls: list[tuple[str, int]] = []

    async def resolve(host: str, port: int) -> list[str]:
        calls.append((host, port))
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolve, calls


# -- check_url ---------------------------------------------------------------------------------


@pytest.mark.parametrize("url", REFUSED)
def test_check_url_refuses(url: str) -> None:
    with pytest.raises(UnsafeURLError) as info:
        check_url(url)
    assert str(info.value).startswith("webhook_url")
    assert isinstance(info.value, InvalidInputError)  # the API answers 422


@pytest.mark.parametrize(("url", "expected"), ACCEPTED)
def test_check_url_accepts(url: str, expected: ParsedTarget) -> None:
    assert check_url(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://10.0.0.1/", "webhook_url host 10.0.0.1 is a private address"),
        ("http://2130706433/", "webhook_url host 127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/", "cloud metadata"),
        ("http://100.64.0.1/", "CGNAT"),
        ("http://[::ffff:10.0.0.1]/", "IPv4-mapped address of 10.0.0.1, a private address"),
        ("http://[64:ff9b::7f00:1]/", "NAT64 address of 127.0.0.1, a loopback address"),
        ("http://[2002:a00:1::]/", "6to4 address of 10.0.0.1, a private address"),
        ("http://[fd12::1]/", "unique local"),
        ("http://foo.internal/", "local-only name"),
        ("ftp://example.com/", "scheme 'ftp' is not allowed"),
        ("http://u:p@example.com/", "credentials"),
        ("http:///x", "no host"),
    ],
)
def test_refusals_say_why(url: str, message: str) -> None:
    with pytest.raises(UnsafeURLError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_url(url)


def test_public_embedded_ipv4_forms_are_accepted() -> None:
    for url in [
        "http://[::ffff:8.8.8.8]/",
        "http://[64:ff9b::808:808]/",
        "http://[2002:808:808::]/",
    ]:
        assert check_url(url).ip is not None


def test_is_unsafe_classifies() -> None:
    ip = ipaddress.ip_address
    assert is_unsafe(ip("8.8.8.8")) is None
    assert is_unsafe(ip("2606:4700::1111")) is None
    assert is_unsafe(ip("127.0.0.2")) == "a loopback address"
    assert is_unsafe(ip("172.31.255.255")) == "a private address"
    assert is_unsafe(ip("0.1.2.3")) == "a 'this network' address"
    assert is_unsafe(ip("198.19.0.1")) == "a benchmarking address"
    assert is_unsafe(ip("203.0.113.9")) == "a documentation address"
    assert is_unsafe(ip("239.1.1.1")) == "a multicast address"
    assert is_unsafe(ip("::")) == "an unspecified address"
    assert is_unsafe(ip("fe80::1")) == "a link-local address"
    assert is_unsafe(ip("::8.8.8.8")) == "a deprecated IPv4-compatible address"
    assert is_unsafe(ip("2001::1")) is not None  # Teredo
    assert is_unsafe(ip("64:ff9b:1::1")) is not None  # local-use NAT64


def test_allow_list_exempts_hosts_and_networks() -> None:
    assert check_url("http://127.0.0.1:9999/", allow=["127.0.0.0/8"]).port == 9999
    assert check_url("http://[::1]/", allow=["::1"]).ip == ipaddress.ip_address("::1")
    assert check_url("http://[::1]/", allow=["[::1]"]).host == "::1"
    assert check_url("http://localhost:8000/", allow=["localhost"]).host == "localhost"
    assert check_url("http://api.internal/", allow=["API.internal."]).host == "api.internal"
    with pytest.raises(UnsafeURLError):
        check_url("http://10.0.0.1/", allow=["127.0.0.0/8"])
    with pytest.raises(UnsafeURLError):
        check_url("http://foo.localhost/", allow=["localhost"])


# -- resolve_safe ------------------------------------------------------------------------------


async def test_resolve_refuses_a_private_answer() -> None:
    resolver, calls = fake_resolver({"hooks.example.com": ["10.0.0.5"]})
    target = check_url("https://hooks.example.com/h")
    with pytest.raises(UnsafeURLError, match=r"resolves to 10\.0\.0\.5, a private address"):
        await resolve_safe(target, resolver=resolver)
    assert calls == [("hooks.example.com", 443)]


async def test_resolve_refuses_if_any_answer_is_private() -> None:
    resolver, _ = fake_resolver({"mixed.example.com": ["8.8.8.8", "10.0.0.5"]})
    with pytest.raises(UnsafeURLError, match=r"10\.0\.0\.5"):
        await resolve_safe(check_url("http://mixed.example.com/"), resolver=resolver)


async def test_resolve_returns_the_first_vetted_address() -> None:
    resolver, _ = fake_resolver({"good.example.com": ["8.8.8.8", "2606:4700::1111"]})
    target = check_url("http://good.example.com:8080/")
    assert await resolve_safe(target, resolver=resolver) == "8.8.8.8"


async def test_resolve_unwraps_mapped_answers() -> None:
    resolver, _ = fake_resolver({"sneaky.example.com": ["::ffff:169.254.169.254"]})
    with pytest.raises(UnsafeURLError, match="metadata"):
        await resolve_safe(check_url("http://sneaky.example.com/"), resolver=resolver)


async def test_resolve_lets_dns_failures_through() -> None:
    resolver, _ = fake_resolver({"empty.example.com": []})
    with pytest.raises(socket.gaierror):
        await resolve_safe(check_url("http://missing.example.com/"), resolver=resolver)
    with pytest.raises(socket.gaierror):
        await resolve_safe(check_url("http://empty.example.com/"), resolver=resolver)


async def test_resolve_rechecks_ip_literals_without_a_lookup() -> None:
    resolver, calls = fake_resolver({})
    target = check_url("http://[2606:4700::1111]/")
    assert await resolve_safe(target, resolver=resolver) == "2606:4700::1111"
    forged = ParsedTarget("http", "10.0.0.1", 80, "/", ipaddress.ip_address("10.0.0.1"))
    with pytest.raises(UnsafeURLError, match="private"):
        await resolve_safe(forged, resolver=resolver)
    assert calls == []


async def test_allow_list_for_resolution() -> None:
    resolver, _ = fake_resolver({"localhost": ["127.0.0.1", "::1"], "dev.test": ["127.0.0.1"]})
    target = check_url("http://127.0.0.1:9999/", allow=["127.0.0.0/8"])
    assert await resolve_safe(target, resolver=resolver, allow=["127.0.0.0/8"]) == "127.0.0.1"
    local = check_url("http://localhost:9999/", allow=["localhost"])
    assert await resolve_safe(local, resolver=resolver, allow=["localhost"]) == "127.0.0.1"
    with pytest.raises(UnsafeURLError):  # the network does not cover ::1
        await resolve_safe(local, resolver=resolver, allow=["127.0.0.0/8"])
    dev = check_url("http://dev.test/")
    assert await resolve_safe(dev, resolver=resolver, allow=["127.0.0.0/8"]) == "127.0.0.1"
    with pytest.raises(UnsafeURLError):
        await resolve_safe(dev, resolver=resolver)


# -- pinned_request_args -----------------------------------------------------------------------


def test_pinned_http_ipv4() -> None:
    url, headers, extensions = pinned_request_args(
        check_url("http://hooks.example.com/h?a=1"), "8.8.8.8"
    )
    assert url == "http://8.8.8.8/h?a=1"
    assert headers == {"Host": "hooks.example.com"}
    assert extensions == {}


def test_pinned_https_ipv6_non_default_port() -> None:
    target = check_url("https://hooks.example.com:8443/h")
    url, headers, extensions = pinned_request_args(target, "2606:4700::1111")
    assert url == "https://[2606:4700::1111]:8443/h"
    assert headers == {"Host": "hooks.example.com:8443"}
    assert extensions == {"sni_hostname": "hooks.example.com"}
    assert httpx.URL(url).host == "2606:4700::1111"


def test_pinned_ip_literal_target() -> None:
    target = check_url("https://[2606:4700::1111]:8443/")
    url, headers, extensions = pinned_request_args(target, "2606:4700::1111")
    assert url == "https://[2606:4700::1111]:8443/"
    assert headers == {"Host": "[2606:4700::1111]:8443"}
    assert extensions == {}  # no SNI for an IP; httpcore verifies the IP itself


# -- real requests over loopback ---------------------------------------------------------------


@asynccontextmanager
async def http_server(
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A one-line HTTP server on 127.0.0.1 answering 200; yields (port, raw request heads)."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ssl_context)
    async with server:
        yield server.sockets[0].getsockname()[1], seen


async def test_pinned_request_reaches_the_vetted_ip_with_the_original_host() -> None:
    async with http_server() as (port, seen):
        resolver, calls = fake_resolver({"hooks.test": ["127.0.0.1"]})
        target = check_url(f"http://hooks.test:{port}/hook?x=1", allow=["127.0.0.0/8"])
        ip = await resolve_safe(target, resolver=resolver, allow=["127.0.0.0/8"])
        url, headers, extensions = pinned_request_args(target, ip)
        async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
            response = await client.post(url, headers=headers, extensions=extensions, content=b"{}")
    assert response.status_code == 200
    assert calls == [("hooks.test", port)]
    head = seen[0].decode()
    assert head.startswith("POST /hook?x=1 HTTP/1.1\r\n")
    assert f"\r\nHost: hooks.test:{port}\r\n" in head


@pytest.fixture
def self_signed(tmp_path: Path) -> Callable[[str], tuple[Path, Path]]:
    """Make a self-signed certificate for a DNS name: returns (cert, key) paths."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")

    def make(name: str) -> tuple[Path, Path]:
        cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-subj",
                f"/CN={name}",
                "-addext",
                f"subjectAltName=DNS:{name}",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
        )
        return cert, key

    return make


async def test_pinned_https_uses_the_name_for_sni_and_certificate(
    self_signed: Callable[[str], tuple[Path, Path]],
) -> None:
    cert, key = self_signed("hooks.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    sni_seen: list[str | None] = []

    def record_sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        sni_seen.append(name)

    server_ctx.sni_callback = record_sni
    client_ctx = ssl.create_default_context(cafile=str(cert))

    async with http_server(server_ctx) as (port, seen):
        resolver, _ = fake_resolver({"hooks.test": ["127.0.0.1"]})
        target = check_url(f"https://hooks.test:{port}/h", allow=["127.0.0.0/8"])
        ip = await resolve_safe(target, resolver=resolver, allow=["127.0.0.0/8"])
        url, headers, extensions = pinned_request_args(target, ip)
        assert url == f"https://127.0.0.1:{port}/h"
        async with httpx.AsyncClient(verify=client_ctx, trust_env=False) as client:
            response = await client.get(url, headers=headers, extensions=extensions)
            assert response.status_code == 200
            # Without the extension, the certificate is checked against 127.0.0.1 and fails.
        async with httpx.AsyncClient(verify=client_ctx, trust_env=False) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(url, headers=headers)
    assert sni_seen[0] == "hooks.test"
    assert f"\r\nHost: hooks.test:{port}\r\n" in seen[0].decode()


async def test_pinned_https_refuses_a_certificate_for_another_name(
    self_signed: Callable[[str], tuple[Path, Path]],
) -> None:
    cert, key = self_signed("other.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with http_server(server_ctx) as (port, _):
        target = check_url(f"https://hooks.test:{port}/h", allow=["127.0.0.0/8"])
        url, headers, extensions = pinned_request_args(target, "127.0.0.1")
        async with httpx.AsyncClient(verify=client_ctx, trust_env=False) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(url, headers=headers, extensions=extensions)
