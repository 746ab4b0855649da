"""Standard Webhooks signatures (https://www.standardwebhooks.com/): HMAC-SHA256, ``v1``.

The signed content is ``f"{msg_id}.{timestamp}."`` followed by the raw body; the signature
travels as ``v1,<base64>`` in the ``webhook-signature`` header next to ``webhook-id`` and
``webhook-timestamp``. Several space-separated signatures let a sender rotate its secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets as _secrets
import time
from collections.abc import Mapping, Sequence

from backburner.errors import ConfigurationError, WebhookVerificationError

SECRET_PREFIX = "whsec_"
HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
DEFAULT_TOLERANCE = 300.0
"""Seconds a timestamp may lie before or after the receiver's clock (replay window)."""

_MIN_KEY_BYTES = 24
_MAX_KEY_BYTES = 64
_NEW_KEY_BYTES = 32
_VERSION = "v1"
_TIMESTAMP = re.compile(r"-?[0-9]{1,18}")


def generate_secret() -> str:
    """A new random secret: ``whsec_`` + base64 of 32 bytes from the ``secrets`` module."""
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(_NEW_KEY_BYTES)).decode("ascii")


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` signature of one message under one secret."""
    _check_message(msg_id, timestamp)
    return _encode(_digest(_key(secret), msg_id, timestamp, body))


def sign(secrets: str | Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three ``webhook-*`` headers for a message, signed with each secret in order.

    Pass the old and the new secret during a rotation; receivers accept either. Raises
    ``ConfigurationError`` for a malformed or missing secret, ``ValueError`` for a bad
    ``msg_id`` (empty, whitespace, ``.`` or unprintable characters) or ``timestamp``.
    """
    keys = _keys(secrets)
    _check_message(msg_id, timestamp)
    signatures = " ".join(_encode(_digest(key, msg_id, timestamp, body)) for key in keys)
    return {
        HEADER_ID: msg_id,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_SIGNATURE: signatures,
    }


def verify(
    secret: str | Sequence[str],
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> int:
    """Check a received webhook; return its timestamp (Unix seconds) if it is authentic.

    ``headers`` is any mapping (a dict, httpx or Starlette ``Headers``); names match
    case-insensitively. ``body`` is the raw body as received (a str is UTF-8 encoded).
    Several secrets may be given during a rotation (a list, or one string with them
    space-separated, as ``BACKBURNER_WEBHOOK_SECRET`` holds them): any one matching ``v1``
    signature suffices; other versions (``v1a``, ...) are ignored. ``now`` defaults to
    ``time.time()``.

    Raises ``WebhookVerificationError`` naming the failed check (missing header, timestamp
    not an integer, too old, in the future, no matching signature), and
    ``ConfigurationError`` for a malformed secret.
    """
    keys = _keys(secret)
    if not (tolerance >= 0):  # also refuses NaN
        raise ValueError(f"tolerance must be >= 0 seconds, got {tolerance!r}")
    msg_id = _header(headers, HEADER_ID)
    raw_timestamp = _header(headers, HEADER_TIMESTAMP)
    raw_signatures = _header(headers, HEADER_SIGNATURE)

    if not _TIMESTAMP.fullmatch(raw_timestamp.strip()):
        raise WebhookVerificationError(
            f"{HEADER_TIMESTAMP} header is not an integer number of seconds"
        )
    timestamp = int(raw_timestamp)
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        raise WebhookVerificationError(
            f"{HEADER_TIMESTAMP} is too old: {current - timestamp:.0f} s ago, "
            f"tolerance {tolerance:g} s"
        )
    if timestamp > current + tolerance:
        raise WebhookVerificationError(
            f"{HEADER_TIMESTAMP} is in the future: {timestamp - current:.0f} s ahead, "
            f"tolerance {tolerance:g} s"
        )

    candidates = _v1_signatures(raw_signatures)
    if not candidates:
        raise WebhookVerificationError(f"{HEADER_SIGNATURE} header holds no v1 signature")
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    for key in keys:
        expected = _digest(key, msg_id, timestamp, data)
        for candidate in candidates:
            if hmac.compare_digest(expected, candidate):
                return timestamp
    raise WebhookVerificationError(f"no v1 signature in {HEADER_SIGNATURE} matches the secret")


def _digest(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    # surrogatepass: a received id with a lone surrogate fails to match instead of crashing
    signed = f"{msg_id}.{timestamp}.".encode("utf-8", "surrogatepass") + bytes(body)
    return hmac.new(key, signed, hashlib.sha256).digest()


def _encode(digest: bytes) -> str:
    return _VERSION + "," + base64.b64encode(digest).decode("ascii")


def check_secrets(secrets: str | Sequence[str]) -> None:
    """ConfigurationError (naming no secret) unless every secret is a usable key."""
    _keys(secrets)


def _keys(secrets: str | Sequence[str]) -> list[bytes]:
    if isinstance(secrets, str):  # (one, or several space-separated: the setting's form)
        secrets = secrets.split() or [secrets]
    keys = [_key(secret) for secret in secrets]
    if not keys:
        raise ConfigurationError("no webhook secret given (an empty list)")
    return keys


def _key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` (or bare base64) secret."""
    if not isinstance(secret, str):
        raise ConfigurationError(f"a webhook secret must be a str, not {type(secret).__name__}")
    encoded = secret.strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError(
            f"webhook secret is malformed: expected {SECRET_PREFIX!r} followed by base64"
        ) from None
    if not _MIN_KEY_BYTES <= len(key) <= _MAX_KEY_BYTES:
        raise ConfigurationError(
            f"webhook secret decodes to {len(key)} bytes; "
            f"expected {_MIN_KEY_BYTES} to {_MAX_KEY_BYTES} (see generate_secret())"
        )
    return key


def _check_message(msg_id: str, timestamp: int) -> None:
    if (
        not isinstance(msg_id, str)
        or not msg_id
        or not msg_id.isprintable()
        or any(ch.isspace() or ch == "." for ch in msg_id)
    ):
        raise ValueError(
            f"msg_id must be a non-empty printable string without whitespace or '.', got {msg_id!r}"
        )
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError(f"timestamp must be an int of Unix seconds >= 0, got {timestamp!r}")


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if isinstance(key, str) and key.lower() == name:
                value = candidate
                break
    if not value:
        raise WebhookVerificationError(f"{name} header is missing or empty")
    return value


def _v1_signatures(header: str) -> list[bytes]:
    """The decoded ``v1`` signatures of the header; malformed entries are skipped."""
    found: list[bytes] = []
    for entry in header.split():
        version, sep, encoded = entry.partition(",")
        if version != _VERSION or not sep:
            continue
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found
