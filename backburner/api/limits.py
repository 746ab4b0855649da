"""Request-body size limits, enforced while the body is read (not trusting Content-Length).

One limit for every route (``max_body_bytes``), and larger ones for the few routes whose
bodies are big by nature (POST /v1/batches: ``max_batch_bytes``), each with its own error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import BodyTooLargeError, error_response


@dataclass(frozen=True, slots=True)
class RouteLimit:
    """The body limit of one POST route, and how a body over it is refused (413)."""

    max_bytes: int
    type: str = "body_too_large"
    message: str = "the request body is larger than {max_bytes} bytes"

    def describe(self) -> str:
        return self.message.format(max_bytes=self.max_bytes)


class RouteBodyTooLargeError(BodyTooLargeError):
    """A body over its route's own limit, found while reading it; ``limit`` says how the route
    answers (the route that reads the body catches this; elsewhere it is a plain 413)."""

    def __init__(self, limit: RouteLimit) -> None:
        super().__init__(limit.max_bytes)
        self.detail = limit.describe()
        self.limit = limit


class BodyLimitMiddleware:
    """Refuse bodies over ``max_bytes`` with 413, declared or not, chunked or not.

    ``routes`` maps the path of a POST route to its own limit, instead of ``max_bytes``."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, routes: Mapping[str, RouteLimit] | None = None
    ) -> None:
        self.app = app
        self.default = RouteLimit(max_bytes)
        self.routes = dict(routes or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        own = self.routes.get(scope["path"]) if scope["method"] == "POST" else None
        limit = own or self.default
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                response = error_response(400, "invalid_body", "Content-Length is not a number")
                await response(scope, receive, send)
                return
            if int(declared) > limit.max_bytes:
                response = error_response(413, limit.type, limit.describe())
                await response(scope, receive, send)
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit.max_bytes:
                    if own is not None:
                        raise RouteBodyTooLargeError(own)
                    raise BodyTooLargeError(limit.max_bytes)
            return message

        await self.app(scope, counted, send)


class SingleQueryValuesMiddleware:
    """Refuse a query parameter given more than once (422): every parameter of this API is one
    value, and silently taking the last of several hides a client's bug."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string", b"") if scope["type"] == "http" else b""
        if query and b"&" in query:
            names = [name for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)]
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                response = error_response(
                    422,
                    "invalid_request",
                    f"query parameter {repeated[0]!r} is given more than once",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
