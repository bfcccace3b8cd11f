"""Signed links to the usage page: a subject and an expiry, HMAC-SHA256 signed.

A token is ``v1.<subject, base64url>.<expiry, Unix seconds>.<signature,
base64url>``; the signature is HMAC-SHA256 under a secret the server keeps
(`metering.storage.history.portal_secret`) of everything before it. It
holds no API key: whoever has the link sees that subject's page until it
expires, and nothing else (no route of the API takes it). A link is
absolute under the server's public URL (`public_url_problem` says what one
may not be: anything but an http or https URL with a host, and no query,
fragment or credentials).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from metering.errors import InvalidInput

VERSION: Final = "v1"
MAX_TTL_SECONDS: Final = 31 * 24 * 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: str, payload: str) -> str:
    digest = hmac.new(secret.encode("utf-8"), payload.encode("ascii"), hashlib.sha256).digest()
    return _b64(digest)


_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: object) -> int:
    """``30m``, ``1h``, ``7d`` (or plain seconds) as seconds: 1 second to 31 days."""
    if isinstance(text, str):
        body = text.strip()
        unit = _UNITS.get(body[-1:], None)
        digits = body[:-1] if unit is not None else body
        if digits.isdecimal() and digits.isascii():
            return validate_ttl(int(digits) * (unit or 1))
    elif isinstance(text, int):
        return validate_ttl(text)
    raise InvalidInput("ttl", f"expected a duration like 30m, 1h or 7d; got {text!r}")


def validate_ttl(ttl_seconds: object) -> int:
    if (
        not isinstance(ttl_seconds, int)
        or isinstance(ttl_seconds, bool)
        or not 1 <= ttl_seconds <= MAX_TTL_SECONDS
    ):
        raise InvalidInput("ttl", f"must be 1 second to 31 days; got {ttl_seconds!r}")
    return ttl_seconds


def sign(secret: str, subject: str, expires_at_s: int) -> str:
    """A token for ``subject``'s page, valid before ``expires_at_s`` (Unix seconds)."""
    payload = f"{VERSION}.{_b64(subject.encode('utf-8'))}.{expires_at_s}"
    return f"{payload}.{_signature(secret, payload)}"


def verify(secret: str, token: object, now_s: int) -> str | None:
    """The subject of a well-signed, unexpired ``token``, else None: whatever its
    characters (a token is ASCII, its expiry ASCII digits, as `sign` writes it)."""
    if not isinstance(token, str) or len(token) > 2_000 or not token.isascii():
        return None
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION or not parts[2].isdigit():
        return None
    payload = ".".join(parts[:3])
    if not hmac.compare_digest(_signature(secret, payload), parts[3]):
        return None
    if int(parts[2]) <= now_s:
        return None
    try:
        return _unb64(parts[1]).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def verify_any(secrets: Iterable[str], token: object, now_s: int) -> str | None:
    """`verify` with each of ``secrets`` in turn (the one in use, then one a
    rotation replaced): the first subject found, else None."""
    found = (verify(secret, token, now_s) for secret in secrets)
    return next((subject for subject in found if subject is not None), None)


def public_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the server's public URL, the base of the links it
    hands out (``https://metering.example.com``, a path allowed); None when it can."""
    try:
        parts = urlsplit(url)
        port = parts.port  # past 65535 or not a number: ValueError
    except ValueError:
        return "is not a URL (a port is a number from 1 to 65535)"
    if port == 0:
        return "must have a port from 1 to 65535"
    if parts.scheme not in ("http", "https"):
        return "must be an http or https URL, such as https://metering.example.com"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user or password"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "must have no query or fragment: the links add their own"
    return None
