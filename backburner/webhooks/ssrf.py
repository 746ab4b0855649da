"""SSRF guard for outgoing webhook requests: refuse URLs that reach private or internal hosts.

Two steps, because a name's addresses can change between submit and delivery:

1. ``check_url`` at submit time: static checks on the URL (scheme, credentials, port) and on
   an IP-literal host, in every spelling ``inet_aton`` accepts (``2130706433``, ``0x7f.1``).
2. ``resolve_safe`` at delivery time: resolve the name, refuse it if *any* address is unsafe,
   and return one vetted address. ``pinned_request_args`` then builds a request that connects
   to that address (no second lookup, so DNS rebinding cannot swap it) while the ``Host``
   header, TLS SNI and certificate check still use the original name.

The dispatcher sends pinned requests with ``follow_redirects=False`` (a redirect would bypass
both steps) and ``trust_env=False`` (a proxy would do its own lookup, and httpcore's proxy
path ignores ``sni_hostname``). httpcore pools connections by (scheme, IP, port): a pooled TLS
connection verified for one name could carry a request for another name at the same IP, so
the dispatcher keeps one client per host or no keep-alive.

``allow`` (off by default) exempts hosts and networks, e.g. ``["127.0.0.0/8", "localhost"]``
for tests and local development.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import UnsafeURLError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``async (host, port) -> [ip, ...]``: how ``resolve_safe`` looks a name up."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL_LENGTH = 2048
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
_HOST_RE = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")
_NUMERIC_LABEL_RE = re.compile(r"[0-9]+|0x[0-9a-f]*")  # WHATWG: such a last label means IPv4
_PORT_RE = re.compile(r"[0-9]{1,5}")

_N = ipaddress.ip_network
_V4_REASONS: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = [
    (_N("0.0.0.0/8"), "a 'this network' address"),
    (_N("10.0.0.0/8"), "a private address"),
    (_N("172.16.0.0/12"), "a private address"),
    (_N("192.168.0.0/16"), "a private address"),
    (_N("100.64.0.0/10"), "a shared (CGNAT) address"),
    (_N("198.18.0.0/15"), "a benchmarking address"),
    (_N("192.0.2.0/24"), "a documentation address"),
    (_N("198.51.100.0/24"), "a documentation address"),
    (_N("203.0.113.0/24"), "a documentation address"),
    (_N("255.255.255.255/32"), "a broadcast address"),
    (_N("192.0.0.0/24"), "an IETF protocol assignment address"),
    (_N("192.88.99.0/24"), "a 6to4 relay anycast address"),
]
_V6_REASONS: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = [
    (_N("fc00::/7"), "a unique local (private) address"),
    (_N("fec0::/10"), "a site-local address"),
    (_N("2001:db8::/32"), "a documentation address"),
    (_N("3fff::/20"), "a documentation address"),
    (_N("64:ff9b:1::/48"), "a local-use NAT64 address"),
]
_METADATA_IP = ipaddress.IPv4Address("169.254.169.254")
_NAT64 = _N("64:ff9b::/96")
_COMPAT = _N("::/96")


@dataclass(frozen=True)
class ParsedTarget:
    """A webhook URL that passed ``check_url``.

    ``host`` is lowercased and IDNA-encoded (an IP literal is normalised, IPv6 without
    brackets); ``port`` has the scheme's default filled in; ``ip`` is set for IP literals.
    """

    scheme: str
    host: str
    port: int
    path_and_query: str
    ip: IPAddress | None = None

    @property
    def authority(self) -> str:
        """The ``Host`` header value: host (bracketed if IPv6), plus ``:port`` if not default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port == _DEFAULT_PORTS[self.scheme]:
            return host
        return f"{host}:{self.port}"


def is_unsafe(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be reached from the server (e.g. "a private address"), or None.

    IPv4-mapped, NAT64 (64:ff9b::/96), 6to4 and IPv4-compatible forms are judged by the
    IPv4 address they embed. Anything else is unsafe unless global unicast.
    """
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        kind, inner = embedded
        reason = _reason(inner)
        if reason is not None:
            return f"{kind} address of {inner}, {reason}"
        if kind == "an IPv4-compatible":  # deprecated; where it routes depends on the host
            return "a deprecated IPv4-compatible address"
        return None
    return _reason(ip)


def check_url(url: str, *, allow: Collection[str] = ()) -> ParsedTarget:
    """Statically check a webhook URL; raise ``UnsafeURLError`` saying why it is refused.

    Refuses non-http(s) schemes, credentials, a missing host, a bad port, unsafe IP
    literals and local-only names (``localhost``, ``*.localhost``, ``*.local``,
    ``*.internal``) unless ``allow`` lists the host or a network holding the IP.
    Names are only vetted for real by ``resolve_safe``.
    """
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeURLError(f"webhook_url is longer than {MAX_URL_LENGTH} characters")
    if any(ch <= " " or ch == "\x7f" for ch in url):
        raise UnsafeURLError("webhook_url must not contain whitespace or control characters")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UnsafeURLError(f"webhook_url is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise UnsafeURLError(
            f"webhook_url scheme {scheme or '(none)'!r} is not allowed (use http or https)"
        )
    if "@" in parts.netloc:
        raise UnsafeURLError("webhook_url must not contain credentials (user:pass@)")
    host, ip, port = _split_netloc(parts.netloc, _DEFAULT_PORTS[scheme])
    allowed = _AllowList.parse(allow)
    if ip is not None:
        if not allowed.covers(host, ip):
            reason = is_unsafe(ip)
            if reason is not None:
                raise UnsafeURLError(f"webhook_url host {host} is {reason}")
    elif not allowed.covers(host, None):
        bare = host.rstrip(".")
        if bare == "localhost" or bare.endswith(_LOCAL_SUFFIXES):
            raise UnsafeURLError(f"webhook_url host {host} is a local-only name")
    path_and_query = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return ParsedTarget(scheme, host, port, path_and_query, ip)


async def resolve_safe(
    target: ParsedTarget, *, resolver: Resolver | None = None, allow: Collection[str] = ()
) -> str:
    """The first of ``resolve_all_safe``'s addresses."""
    return (await resolve_all_safe(target, resolver=resolver, allow=allow))[0]


async def resolve_all_safe(
    target: ParsedTarget, *, resolver: Resolver | None = None, allow: Collection[str] = ()
) -> list[str]:
    """Resolve ``target.host`` and return its addresses in the resolver's order (the one
    to try first, first), if every address is safe.

    Raises ``UnsafeURLError`` if any address is unsafe (one private A record among public
    ones is enough); a failed lookup raises ``socket.gaierror`` (retry it as a connection
    error). An IP-literal target is re-checked without a lookup.
    """
    allowed = _AllowList.parse(allow)
    if target.ip is not None:
        addresses = [target.ip]
    else:
        found = await (resolver or _getaddrinfo)(target.host, target.port)
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, f"{target.host} has no addresses")
        try:
            addresses = [ipaddress.ip_address(a) for a in found]
        except ValueError as exc:
            raise UnsafeURLError(f"webhook_url host {target.host}: {exc}") from None
    for ip in addresses:
        if allowed.covers(target.host, ip):
            continue
        reason = is_unsafe(ip)
        if reason is not None:
            if target.ip is not None:
                raise UnsafeURLError(f"webhook_url host {target.host} is {reason}")
            raise UnsafeURLError(f"webhook_url host {target.host} resolves to {ip}, {reason}")
    return [str(ip) for ip in addresses]


def pinned_request_args(
    target: ParsedTarget, ip: str
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``(url, headers, extensions)`` for an httpx request to ``target`` that connects to ``ip``.

    The URL carries the IP, so no second lookup happens; ``Host`` names the original host and,
    for https, the ``sni_hostname`` extension makes httpcore send that name as SNI and verify
    the certificate against it. Send with ``follow_redirects=False``.
    """
    address = ipaddress.ip_address(ip)
    literal = str(address).replace("%", "%25")  # an IPv6 zone id, percent-encoded
    if address.version == 6:
        literal = f"[{literal}]"
    port = "" if target.port == _DEFAULT_PORTS[target.scheme] else f":{target.port}"
    url = f"{target.scheme}://{literal}{port}{target.path_and_query}"
    extensions: dict[str, Any] = {}
    if target.scheme == "https" and target.ip is None:
        extensions["sni_hostname"] = target.host
    return url, {"Host": target.authority}, extensions


def _split_netloc(netloc: str, default_port: int) -> tuple[str, IPAddress | None, int]:
    """(normalised host, IP if a literal, port) of a netloc without userinfo."""
    if netloc.startswith("["):
        end = netloc.find("]")
        raw, rest = netloc[1:end], netloc[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise UnsafeURLError("webhook_url host is not a valid bracketed IPv6 address")
        port_text = rest[1:] if rest else ""
        try:
            ip6 = ipaddress.IPv6Address(raw)
        except ValueError:
            raise UnsafeURLError(f"webhook_url host [{raw}] is not a valid IPv6 address") from None
        if ip6.scope_id:
            raise UnsafeURLError("webhook_url host must not carry an IPv6 zone id")
        return str(ip6), ip6, _port(port_text, default_port)
    if netloc.count(":") > 1:
        raise UnsafeURLError("webhook_url host: an IPv6 address must be in brackets")
    raw, _, port_text = netloc.partition(":")
    port = _port(port_text, default_port)
    host = _normalise_name(raw)
    labels = host.rstrip(".").split(".")
    if not _NUMERIC_LABEL_RE.fullmatch(labels[-1]):
        return host, None, port
    try:  # every legacy spelling: 2130706433, 0177.0.0.1, 0x7f.0.0.1, 127.1
        ip4 = ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        raise UnsafeURLError(f"webhook_url host {host} is not a valid IPv4 address") from None
    return str(ip4), ip4, port


def _normalise_name(raw: str) -> str:
    host = raw.lower()
    if not host:
        raise UnsafeURLError("webhook_url has no host")
    if not host.isascii():
        import idna  # (its tables, only for a name that needs them)

        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise UnsafeURLError(f"webhook_url host {raw!r} is not a valid name: {exc}") from None
    labels = host.rstrip(".").split(".")
    if (
        not _HOST_RE.fullmatch(host)
        or len(host.rstrip(".")) > 253
        or any(len(label) > 63 for label in labels)
    ):
        raise UnsafeURLError(f"webhook_url host {raw!r} is not a valid host name")
    return host


def _port(text: str, default: int) -> int:
    if not text:
        return default
    if not _PORT_RE.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise UnsafeURLError(f"webhook_url port {text!r} is not valid (1-65535)")
    return int(text)


def _embedded_ipv4(ip: IPAddress) -> tuple[str, ipaddress.IPv4Address] | None:
    if ip.version == 4:
        return None
    assert isinstance(ip, ipaddress.IPv6Address)
    if ip.ipv4_mapped is not None:
        return "an IPv4-mapped", ip.ipv4_mapped
    if ip.sixtofour is not None:
        return "a 6to4", ip.sixtofour
    if ip in _NAT64:
        return "a NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _COMPAT and int(ip) > 1:  # not :: or ::1
        return "an IPv4-compatible", ipaddress.IPv4Address(int(ip))
    return None


def _reason(ip: IPAddress) -> str | None:
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        if ip == _METADATA_IP:
            return "a link-local address (the cloud metadata endpoint)"
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    for network, reason in _V4_REASONS if ip.version == 4 else _V6_REASONS:
        if ip in network:
            return reason
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "a non-public address"
    return None


@dataclass(frozen=True)
class _AllowList:
    names: frozenset[str]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    @classmethod
    def parse(cls, entries: Collection[str]) -> _AllowList:
        names: set[str] = set()
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            text = entry.strip().lower().removeprefix("[").removesuffix("]")
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                names.add(text.rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def covers(self, host: str, ip: IPAddress | None) -> bool:
        """True if ``host`` is listed by name, or ``ip`` (or the IPv4 it embeds) is in a network."""
        if host.rstrip(".") in self.names:
            return True
        if ip is None:
            return False
        embedded = _embedded_ipv4(ip)
        candidates = [ip] if embedded is None else [ip, embedded[1]]
        return any(c in net for c in candidates for net in self.networks)


async def _getaddrinfo(host: str, port: int) -> list[str]:
    # (AI_ADDRCONFIG: no IPv6 answers on a host with no IPv6 address, as in most containers)
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
