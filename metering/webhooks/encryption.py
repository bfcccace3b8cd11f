"""Webhook secrets at rest: Fernet (AES-128-CBC with HMAC-SHA256) under the
keys of ``METERING_SECRET_KEY``.

The variable holds one key or several, comma-separated, newest first: the
first encrypts, every one decrypts (`cryptography`'s MultiFernet), so a new
key is put in front, `Webhooks.reencrypt` (``metering webhooks reencrypt``)
moves the stored secrets under it, and then the old key is removed.

A stored value is ``fernet:`` + the Fernet token when encrypted; anything else
is a plaintext secret of before (or of a deployment without a key), which is
still read as it is and encrypted by the next `reencrypt`. Without a key,
secrets are stored in plaintext (``metering webhooks add`` warns); an
encrypted value without a key that opens it is a `SecretKeyError`.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Final

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from metering.clock import Clock, system_clock
from metering.errors import ConfigurationError, SecretKeyError
from metering.settings import SECRET_KEY_VARIABLE, secret_keys

ENCRYPTED_PREFIX: Final = "fernet:"


def generate_key() -> str:
    """A new key for ``METERING_SECRET_KEY`` (32 random bytes, url-safe base64)."""
    return Fernet.generate_key().decode()


def is_encrypted(stored: str) -> bool:
    return stored.startswith(ENCRYPTED_PREFIX)


def _fernet(key: str, position: int, count: int) -> Fernet:
    try:
        return Fernet(key.encode())
    except (ValueError, binascii.Error):
        which = f"key {position} of {count}" if count > 1 else "the key"
        raise ConfigurationError(
            f"{SECRET_KEY_VARIABLE}: {which} is not a Fernet key (32 bytes in url-safe "
            "base64, 44 characters): make one with `metering webhooks keygen`"
        ) from None


class SecretBox:
    """Encrypts secrets for storage and decrypts them for signing.

    ``keys`` newest first; none means secrets are stored as they are. The
    clock dates new tokens (Fernet records when a token was made).
    """

    def __init__(self, keys: Sequence[str], clock: Clock = system_clock) -> None:
        fernets = [_fernet(key, n, len(keys)) for n, key in enumerate(keys, start=1)]
        self._primary = fernets[0] if fernets else None
        self._all = MultiFernet(fernets) if fernets else None
        self._clock = clock

    @classmethod
    def from_env(cls, clock: Clock = system_clock) -> SecretBox:
        """The keys of ``METERING_SECRET_KEY``; a malformed one is a `ConfigurationError`."""
        return cls(secret_keys(), clock)

    @property
    def encrypts(self) -> bool:
        """Whether new secrets are stored encrypted (a key is configured)."""
        return self._primary is not None

    def seal(self, secret: str) -> str:
        """The value to store for ``secret``: encrypted under the newest key, if any."""
        if self._primary is None:
            return secret
        now = int(self._clock().timestamp())
        return ENCRYPTED_PREFIX + self._primary.encrypt_at_time(secret.encode(), now).decode()

    def open(self, stored: str, endpoint_id: str | None = None) -> str:
        """The secret a stored value holds; `SecretKeyError` if no key decrypts it."""
        if not is_encrypted(stored):
            return stored
        if self._all is None:
            raise SecretKeyError(
                f"the secret of webhook endpoint {endpoint_id or '?'} is encrypted and "
                f"{SECRET_KEY_VARIABLE} is not set",
                endpoint_id,
            )
        try:
            return self._all.decrypt(stored[len(ENCRYPTED_PREFIX) :].encode()).decode()
        except InvalidToken:
            raise SecretKeyError(
                f"the secret of webhook endpoint {endpoint_id or '?'} was encrypted with a key "
                f"that {SECRET_KEY_VARIABLE} no longer holds (keep the old key after the new "
                "one until `metering webhooks reencrypt` has run)",
                endpoint_id,
            ) from None

    def reseal(self, stored: str, endpoint_id: str | None = None) -> str:
        """``stored`` encrypted under the newest key: unchanged when it already is (or
        when there is no key), encrypted when plaintext, re-encrypted otherwise."""
        if self._primary is None:
            return stored
        if not is_encrypted(stored):
            return self.seal(stored)
        try:
            self._primary.decrypt(stored[len(ENCRYPTED_PREFIX) :].encode())
        except InvalidToken:
            return self.seal(self.open(stored, endpoint_id))
        return stored
