"""Who is calling: ``Authorization: Bearer <key>`` → a ``Principal`` (tenant, admin)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from ..errors import AuthError, MalformedAuthError, PermissionDeniedError
from ..keys import KeyRing, Principal

KEYLESS = Principal(tenant="default", admin=True)
"""Every caller when no key is configured (local development)."""

_BEARER = re.compile(r"Bearer +([A-Za-z0-9\-._~+/]+=*) *", re.IGNORECASE)
"""RFC 6750's b64token after the scheme (which is case-insensitive)."""


class BearerAuth(HTTPBearer):
    """The FastAPI dependency (documented in OpenAPI as bearer auth) that answers 400 for a
    malformed header and 401 for a missing or unknown key, saying nothing about tenants.
    Stateless: the keys are the application's (``app.state.keys``)."""

    def __init__(self) -> None:
        super().__init__(auto_error=False, description="An API key: `Bearer bb_...`.")

    async def __call__(self, request: Request) -> Principal:  # type: ignore[override]
        keys: KeyRing = request.app.state.keys
        if keys.open:
            check_loopback_host(request)
            return KEYLESS
        header = request.headers.getlist("authorization")
        if not header:
            raise AuthError("an API key is required: Authorization: Bearer <key>")
        match = _BEARER.fullmatch(header[0]) if len(header) == 1 else None
        if match is None:
            raise MalformedAuthError(
                "the Authorization header must be one 'Bearer <key>' (RFC 6750)"
            )
        principal = keys.lookup(match.group(1))
        if principal is None:
            raise AuthError("invalid API key")
        return principal


def check_loopback_host(request: Request) -> None:
    """A keyless server's caller is an admin: on a loopback address it answers only requests
    that name a loopback host. A web page whose own name was made to resolve to 127.0.0.1
    (DNS rebinding) would otherwise be that caller, and read every job's results."""
    server = request.scope.get("server")
    if not server or not _is_loopback_ip(str(server[0])):
        return  # (served elsewhere on purpose: --insecure)
    host = request.headers.get("host")
    if host is None:
        return  # (HTTP/1.0: no browser sends a request without Host)
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost") or _is_loopback_ip(name):
        return
    raise PermissionDeniedError(
        f"this server has no API keys, so it answers only requests addressed to a loopback"
        f" host (127.0.0.1, [::1], localhost), not to {host!r}: a page of that site could"
        " otherwise use it (DNS rebinding). Set API keys to serve other names."
    )


def _is_loopback_ip(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


Caller = Annotated[Principal, Depends(BearerAuth())]
"""A route's parameter ``caller: Caller`` is the authenticated caller."""


def require_admin(caller: Principal) -> None:
    if not caller.admin:
        raise PermissionDeniedError("this needs an admin key")


def scope(caller: Principal) -> str | None:
    """The tenant a caller's reads are limited to (None: an admin sees every tenant)."""
    return None if caller.admin else caller.tenant
