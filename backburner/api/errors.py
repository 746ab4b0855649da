"""Every error the API answers has one shape: ``{"error": {"type", "message"}}``."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from ..errors import (
    AuthError,
    BackburnerError,
    BackendError,
    CorruptRecordError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidTransitionError,
    JobNotFoundError,
    LimitExceededError,
    MalformedAuthError,
    PermissionDeniedError,
    QueueFullError,
    QuotaExceededError,
    SubmitRateLimitedError,
    UnknownTaskError,
)
from .schemas import ErrorBody

log = logging.getLogger("backburner.api")

# Library exceptions, most specific first: (class, HTTP status, error type).
_MAPPING: list[tuple[type[BackburnerError], int, str]] = [
    (MalformedAuthError, 400, "invalid_authorization"),
    (PermissionDeniedError, 403, "forbidden"),
    (AuthError, 401, "unauthorized"),
    (QuotaExceededError, 429, "quota_exceeded"),
    (SubmitRateLimitedError, 429, "rate_limited"),
    (UnknownTaskError, 422, "unknown_task"),
    (InvalidInputError, 422, "invalid_input"),
    (JobNotFoundError, 404, "not_found"),
    (IdempotencyConflictError, 409, "idempotency_conflict"),
    (InvalidTransitionError, 409, "invalid_state"),
    (QueueFullError, 429, "queue_full"),
    (CorruptRecordError, 500, "corrupt_record"),
    (BackendError, 503, "backend_unavailable"),
]

_HTTP_TYPES = {
    400: "invalid_body",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


def _unavailable(method: str) -> str:
    """A 503's message: what the backend said (its address, a database's own words) is in the
    server's log, not for every caller. A write may have taken effect all the same: its reply
    can be what was lost."""
    message = "the backend is unavailable; try again after Retry-After"
    if method in ("POST", "PUT", "PATCH", "DELETE"):
        message += (
            " (the request may have taken effect: repeat it with the same Idempotency-Key,"
            " or look before you repeat it)"
        )
    return message


def error_response(
    status: int, type: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody.model_validate({"error": {"type": type, "message": message}})
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def documented(
    *statuses: int, also: dict[int | str, dict[str, Any]] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the error statuses a route can answer."""
    entries: dict[int | str, dict[str, Any]] = dict(also or {})
    for status in statuses:
        entries[status] = {"model": ErrorBody, "description": "an error"}
    return entries


class BodyTooLargeError(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


def _allowed_methods(routes: Sequence[BaseRoute], path: str) -> list[str]:
    methods: set[str] = set()
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:  # (FastAPI includes a router lazily: its routes are inside)
            methods.update(_allowed_methods(included.routes, path))
            continue
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(path):
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_error_handlers(app: FastAPI, routes: Sequence[BaseRoute]) -> None:
    """Map every error to the one shape; ``routes`` are the API's own (for 405's Allow)."""

    @app.exception_handler(BackburnerError)
    async def library_error(request: Request, exc: BackburnerError) -> JSONResponse:
        for cls, status, type_ in _MAPPING:
            if isinstance(exc, cls):
                headers = {"Retry-After": "5"} if status in (429, 503) else None
                if isinstance(exc, LimitExceededError) and exc.retry_after is not None:
                    headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
                if status == 401:
                    headers = {"WWW-Authenticate": 'Bearer realm="backburner"'}
                if status >= 500:
                    log.warning("%s %s: %s", request.method, request.url.path, exc)
                message = str(exc)
                if status == 503:
                    message = _unavailable(request.method)
                return error_response(status, type_, message, headers)
        log.error("%s %s: unexpected %r", request.method, request.url.path, exc)
        return error_response(500, "internal_error", "internal error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if broken is not None:
            reason = (broken.get("ctx") or {}).get("error", "it does not parse")
            return error_response(400, "invalid_json", f"the body is not valid JSON: {reason}")
        if any(tuple(e.get("loc", ())) == ("body",) and e.get("type") == "missing" for e in errors):
            # (as POST /v1/batches answers it: no body is no JSON)
            return error_response(400, "invalid_json", "the body is empty: send a JSON object")
        problems = []
        for item in errors[:5]:
            loc = tuple(item.get("loc", ()))
            if loc == ("body",) and item.get("type") in ("model_attributes_type", "dict_type"):
                problems.append("the body must be a JSON object (Content-Type: application/json)")
                continue
            where = ".".join(str(part) for part in loc if part != "body")
            problems.append(f"{where or 'body'}: {item.get('msg', 'invalid')}")
        return error_response(422, "invalid_request", "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = _HTTP_TYPES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 400 and "parsing the body" in message:
            message = "the body is not valid UTF-8 JSON (or nests too deeply to parse)"
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code == 405:
            # Starlette names the methods of the first route that matched the path only.
            allowed = _allowed_methods(routes, request.url.path)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
            message = f"{request.method} is not allowed here; use {' or '.join(allowed)}"
        return error_response(exc.status_code, type_, message, headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal_error", "internal error")
