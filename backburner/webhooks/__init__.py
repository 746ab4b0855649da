"""Webhooks: Standard Webhooks signing and verification, the SSRF guard, the dispatcher.

Receivers need only ``verify``: ``backburner.webhooks.verify(secret, headers, body)``.
"""

from backburner.errors import UnsafeURLError, WebhookVerificationError
from backburner.webhooks.signing import generate_secret, sign, signature, verify

__all__ = [
    "UnsafeURLError",
    "WebhookVerificationError",
    "generate_secret",
    "sign",
    "signature",
    "verify",
]
