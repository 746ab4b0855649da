"""Error answers of the API as typed exceptions (``backburner.errors`` classes + ``APIError``)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from ..errors import (
    APIError,
    AuthError,
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
from ._policy import parse_retry_after

# Each is the library's class for that error and an APIError (status, type, retry_after).
# APIError comes first so its __init__ keeps the server's message.


class JobNotFoundAPIError(APIError, JobNotFoundError):
    """404: no such job."""


class IdempotencyConflictAPIError(APIError, IdempotencyConflictError):
    """409 idempotency_conflict: the key is taken by a job with another body."""


class InvalidTransitionAPIError(APIError, InvalidTransitionError):
    """409 invalid_state: the job's status does not allow that."""


class InvalidInputAPIError(APIError, InvalidInputError):
    """400, 413 or 422: the request was refused as invalid."""


class UnknownTaskAPIError(APIError, UnknownTaskError):
    """422 unknown_task: no task of that type is registered."""


class QueueFullAPIError(APIError, QueueFullError):
    """429: the queue is full (after the client's retries)."""


class QuotaExceededAPIError(APIError, QuotaExceededError):
    """429 quota_exceeded: the tenant has its most jobs in flight (after the client's retries)."""


class SubmitRateLimitedAPIError(APIError, SubmitRateLimitedError):
    """429 rate_limited: the tenant submits faster than its rate (after the client's retries)."""


class AuthAPIError(APIError, AuthError):
    """401 unauthorized: no API key, or one the server does not know."""


class MalformedAuthAPIError(APIError, MalformedAuthError):
    """400 invalid_authorization: the Authorization header is not ``Bearer <key>``."""


class PermissionDeniedAPIError(APIError, PermissionDeniedError):
    """403 forbidden: the key may not do that (an admin-only route)."""


class BackendUnavailableAPIError(APIError, BackendError):
    """503 backend_unavailable: the server's storage failed (after the client's retries)."""


class CorruptRecordAPIError(APIError, CorruptRecordError):
    """500 corrupt_record: the server stores the job, but its record cannot be read."""


_TASK_IN_MESSAGE = re.compile(r"\bjob (task_[0-9A-Za-z_-]+)")


def error_class(status: int, type: str) -> type[APIError]:
    """The exception class for an error answer."""
    if status == 404:
        return JobNotFoundAPIError
    if status == 409:
        if type == "idempotency_conflict":
            return IdempotencyConflictAPIError
        if type == "invalid_state":
            return InvalidTransitionAPIError
        return APIError
    if status == 401:
        return AuthAPIError
    if status == 403:
        return PermissionDeniedAPIError
    if status == 400 and type == "invalid_authorization":
        return MalformedAuthAPIError
    if status in (400, 413, 422):
        return UnknownTaskAPIError if type == "unknown_task" else InvalidInputAPIError
    if status == 429:
        if type == "quota_exceeded":
            return QuotaExceededAPIError
        if type == "rate_limited":
            return SubmitRateLimitedAPIError
        return QueueFullAPIError
    if status == 503 and type == "backend_unavailable":
        return BackendUnavailableAPIError
    if status == 500 and type == "corrupt_record":
        return CorruptRecordAPIError
    return APIError


def _error_body(response: httpx.Response) -> tuple[str, str]:
    body: Any = None
    try:
        body = json.loads(response.content)
    except ValueError:
        pass
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        type_, message = detail.get("type"), detail.get("message")
        if isinstance(type_, str) and isinstance(message, str):
            return type_, message
    # Not our error shape: a proxy's page, say. Keep a short excerpt of it.
    text = " ".join(response.text.split())[:200]
    reason = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    return "http_error", f"{reason}: {text}" if text else reason


def raise_for_error(
    response: httpx.Response, *, task_id: str | None = None, key: str | None = None
) -> None:
    """Raise the typed exception for an error answer (the body must have been read)."""
    if response.is_success:
        return
    type_, message = _error_body(response)
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    cls = error_class(response.status_code, type_)
    exc = cls(message, status=response.status_code, type=type_, retry_after=retry_after)
    if isinstance(exc, JobNotFoundError):
        exc.task_id = task_id or ""
    if isinstance(exc, CorruptRecordError):
        exc.task_id, exc.reason = task_id, message
    if isinstance(exc, LimitExceededError):
        exc.tenant = ""  # the server does not name it; the caller knows its own
    if isinstance(exc, IdempotencyConflictError):
        exc.key = key or ""
        found = _TASK_IN_MESSAGE.search(message)
        exc.task_id = found.group(1) if found else ""
    raise exc


def invalid_response(response: httpx.Response, problem: object) -> APIError:
    """A 2xx answer the client cannot read (a proxy in the way, or a version mismatch)."""
    return APIError(
        f"unexpected answer to {response.request.method} {response.request.url.path}: {problem}",
        status=response.status_code,
        type="invalid_response",
    )
