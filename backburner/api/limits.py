"""Request-body size limit, enforced while the body is read (not trusting Content-Length)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import BodyTooLargeError, error_response


class BodyLimitMiddleware:
    """Refuse bodies over ``max_bytes`` with 413, declared or not, chunked or not."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                response = error_response(400, "invalid_body", "Content-Length is not a number")
                await response(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                response = error_response(
                    413, "body_too_large", f"the request body is larger than {self.max_bytes} bytes"
                )
                await response(scope, receive, send)
                return
        seen = 0
        limit = self.max_bytes

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLargeError(limit)
            return message

        await self.app(scope, counted, send)
