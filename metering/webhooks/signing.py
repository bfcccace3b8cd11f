"""Standard Webhooks signatures: sign for senders, verify for receivers.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the
signature is ``v1,`` + base64(HMAC-SHA256(key, content)), where the key is
the base64-decoded part of the secret after ``whsec_``. Several signatures
(a rotation's old and new secret) are separated by spaces.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Final

from metering.errors import InvalidInput, WebhookVerificationError

SECRET_PREFIX: Final = "whsec_"
SECRET_BYTES: Final = 24
DEFAULT_TOLERANCE_SECONDS: Final = 300
# Unix seconds have 10 digits until 2286; a longer header is refused before
# any arithmetic (a 400-digit integer overflows a float).
MAX_TIMESTAMP_DIGITS: Final = 12


def generate_secret() -> str:
    """A new secret: ``whsec_`` + base64 of 24 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a secret (``whsec_`` optional); `InvalidInput` if it is not base64."""
    text = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("secret", "must be 'whsec_' followed by base64") from None
    if not 16 <= len(key) <= 64:
        raise InvalidInput("secret", "must hold 16 to 64 bytes (base64 after 'whsec_')")
    return key


def validate_secret(secret: str) -> str:
    secret_key(secret)
    return secret if secret.startswith(SECRET_PREFIX) else SECRET_PREFIX + secret


def mask_secret(secret: str) -> str:
    """A form safe to show: the prefix and the last four characters."""
    return f"{SECRET_PREFIX}…{secret[-4:]}"


def _signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    content = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign(
    body: bytes | str, message_id: str, timestamp: int | datetime, secrets: Iterable[str] | str
) -> str:
    """The ``webhook-signature`` header: one ``v1,...`` per secret, space-separated."""
    data = body.encode() if isinstance(body, str) else body
    seconds = int(timestamp.timestamp()) if isinstance(timestamp, datetime) else int(timestamp)
    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    return " ".join(_signature(secret_key(k), message_id, seconds, data) for k in keys)


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"missing header {name}")


def _timestamp(text: str) -> int:
    """Unix seconds in ASCII digits only: no sign, spaces, underscores or other scripts'
    digits (``int()`` accepts all of those, and the signature is over the text)."""
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_TIMESTAMP_DIGITS:
        raise WebhookVerificationError("webhook-timestamp is not a number of Unix seconds")
    return int(text)


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: datetime | None = None,
) -> None:
    """Check a received webhook; raise `WebhookVerificationError` if it is not genuine.

    ``headers`` holds ``webhook-id``, ``webhook-timestamp`` and
    ``webhook-signature`` (any case). The timestamp must be within
    ``tolerance`` seconds of ``now`` (an aware datetime; default: the system
    clock), before or after. Comparison is constant-time.
    """
    message_id = _header(headers, "webhook-id")
    timestamp = _timestamp(_header(headers, "webhook-timestamp"))
    if now is None:
        from metering.clock import system_clock

        now = system_clock()
    if abs(now.timestamp() - timestamp) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is too old or in the future")
    data = body.encode() if isinstance(body, str) else body
    expected = _signature(secret_key(secret), message_id, timestamp, data)
    for candidate in _header(headers, "webhook-signature").split():
        if hmac.compare_digest(candidate.encode(), expected.encode()):
            return
    raise WebhookVerificationError("no matching signature")
