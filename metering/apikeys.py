"""API keys of the HTTP API: create, list, revoke, authenticate (docs/api-auth.md).

`ApiKeys(meter)` works on the meter's database and clock (a `Database` will do too).
`create` returns the `ApiKey` and its token, shown once: ``mk_`` + the key's id (12 hex
digits) + ``_`` + 256 random bits; only the token's SHA-256 is stored, and `authenticate`
looks the row up by id and compares hashes in constant time (None: unknown or revoked).
`revoke` refuses the key from the next request on. Scopes (`GRANTS`): ``ingest`` sends
usage, ``read`` reads it (optionally of one subject only), ``admin`` does both and manages
the rest; ``ingest`` and ``read`` do not include each other. The last use is written at
most once a minute per key (`LAST_USED_STEP_US`): one read per request, a write a minute.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final, cast

from sqlalchemy import Connection

from metering.domain.bounds import shown
from metering.domain.events import validate_subject
from metering.domain.instants import from_us
from metering.errors import InvalidInput, UnknownApiKey

# The API's settings (METERING_API_AUTH, METERING_API_RATE, METERING_METRICS_SCOPE)
# are read in `metering.settings`; a key's scope is named there too.
from metering.settings import Scope
from metering.storage.api_keys import ApiKeyRecord, ApiKeyStore
from metering.storage.database import DatabaseSource, database_of

SCOPES: Final[tuple[Scope, ...]] = ("ingest", "read", "admin")
# What a key of each scope may do.
GRANTS: Final[Mapping[str, frozenset[str]]] = {
    "ingest": frozenset({"ingest"}),
    "read": frozenset({"read"}),
    "admin": frozenset({"ingest", "read", "admin"}),
}

TOKEN_PREFIX: Final = "mk_"
ID_HEX_DIGITS: Final = 12
SECRET_BYTES: Final = 32
SECRET_CHARS: Final = 43  # token_urlsafe(32): 32 bytes in unpadded base64url
_TOKEN: Final = re.compile(
    rf"({TOKEN_PREFIX}[0-9a-f]{{{ID_HEX_DIGITS}}})_([A-Za-z0-9_-]{{{SECRET_CHARS}}})"
)
_KEY_ID: Final = re.compile(rf"{TOKEN_PREFIX}[0-9a-f]{{{ID_HEX_DIGITS}}}")
MAX_NAME_CHARS: Final = 200
LAST_USED_STEP_US: Final = 60_000_000


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as listings show it: never the token."""

    id: str
    scope: Scope
    name: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    # A customer's key: a read key that sees only this subject (None: all).
    subject: str | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def allows(self, scope: str) -> bool:
        """Whether this key may call a route that needs ``scope``."""
        return not self.revoked and scope in GRANTS[self.scope]

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "scope": self.scope,
            "name": self.name,
            "created_at": self.created_at.isoformat(),
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
            "subject": self.subject,
        }


def _key(record: ApiKeyRecord) -> ApiKey:
    return ApiKey(
        id=record.id,
        scope=cast(Scope, record.scope),
        name=record.name,
        created_at=from_us(record.created_at_us),
        revoked_at=None if record.revoked_at_us is None else from_us(record.revoked_at_us),
        last_used_at=None if record.last_used_at_us is None else from_us(record.last_used_at_us),
        subject=record.subject,
    )


def token_hash(token: str) -> str:
    """The stored form of a token: SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def validate_scope(scope: object) -> Scope:
    if scope not in SCOPES:
        raise InvalidInput("scope", f"must be one of {', '.join(SCOPES)}; got {shown(scope)}")
    return scope


def validate_name(name: object) -> str:
    """A key's name: up to 200 printable characters (empty is allowed)."""
    if not isinstance(name, str):
        raise InvalidInput("name", f"must be text, got {shown(name)}")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidInput("name", f"must be at most {MAX_NAME_CHARS} characters")
    if not name.isprintable():
        raise InvalidInput("name", f"{shown(name)} has control characters")
    return name.strip()


def key_id_of(text: object) -> str:
    """The key id in ``text``: an id (``mk_`` + 12 hex digits) or a whole token."""
    if isinstance(text, str):
        if _KEY_ID.fullmatch(text):
            return text
        match = _TOKEN.fullmatch(text)
        if match is not None:
            return match.group(1)
    raise InvalidInput(
        "id", f"{shown(text)} is not an API key id ({TOKEN_PREFIX} and 12 hex digits)"
    )


_created = 0  # keys this process created: see `created_in_process`


def created_in_process() -> int:
    """How many keys this process created so far (`ApiKeys.create`): a change
    tells a cache of "no key exists" in the same process to look again."""
    return _created


class ApiKeys:
    """API keys on a database (a `Meter`'s, or a `Database`), in its clock's time."""

    def __init__(self, source: DatabaseSource) -> None:
        self.database = database_of(source)

    def create(self, scope: str, name: str = "", subject: str | None = None) -> tuple[ApiKey, str]:
        """A new key and its token. The token is not stored: show it now, once.

        ``subject``: a customer's key, of scope ``read`` only, that sees that
        subject alone (`metering.api.auth`: every other subject is 404).
        """
        checked_scope = validate_scope(scope)
        checked_name = validate_name(name)
        if subject is not None:
            subject = validate_subject(subject)
            if checked_scope != "read":
                raise InvalidInput(
                    "subject", f"only a read key can be limited to a subject; got {checked_scope}"
                )
        key_id = TOKEN_PREFIX + secrets.token_hex(ID_HEX_DIGITS // 2)
        token = f"{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"
        now_us = self.database.now_us()
        self.database.run(
            lambda c: ApiKeyStore(c).insert(
                key_id, token_hash(token), checked_scope, checked_name, now_us, subject
            )
        )
        global _created
        _created += 1
        key = ApiKey(key_id, checked_scope, checked_name, from_us(now_us), None, None, subject)
        return key, token

    def list(self) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first."""
        return [_key(r) for r in self.database.run(lambda c: ApiKeyStore(c).list())]

    def get(self, key_id: str) -> ApiKey:
        wanted = key_id_of(key_id)
        record = self.database.run(lambda c: ApiKeyStore(c).get(wanted))
        if record is None:
            raise UnknownApiKey(wanted)
        return _key(record)

    def revoke(self, key_id: str) -> bool:
        """Revoke a key: refused from the next request on, in every process.

        True if it is revoked now, False if it already was; `UnknownApiKey`
        if there is no such key. The row stays (listings show it revoked).
        """
        wanted = key_id_of(key_id)
        now_us = self.database.now_us()

        def work(connection: Connection) -> bool | None:
            store = ApiKeyStore(connection)
            if store.revoke(wanted, now_us):
                return True
            return False if store.get(wanted) is not None else None

        revoked = self.database.run(work)
        if revoked is None:
            raise UnknownApiKey(wanted)
        return revoked

    def any_exist(self) -> bool:
        """Whether any key was ever created (revoked keys count)."""
        return self.database.run(lambda c: ApiKeyStore(c).any())

    def authenticate(self, token: str) -> ApiKey | None:
        """The key whose token this is, or None: malformed, unknown or revoked.

        One primary-key read; and, when the stored last use is a minute old
        or more, one conditional write of the new one.
        """
        match = _TOKEN.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            return None
        key_id = match.group(1)
        record = self.database.run(lambda c: ApiKeyStore(c).get(key_id))
        if record is None or not hmac.compare_digest(token_hash(token), record.secret_hash):
            return None
        if record.revoked_at_us is not None:
            return None
        now_us = self.database.now_us()
        last = record.last_used_at_us
        if last is None or now_us - last >= LAST_USED_STEP_US:
            self.database.run(
                lambda c: ApiKeyStore(c).note_use(key_id, now_us, now_us - LAST_USED_STEP_US + 1)
            )
            last = now_us
        return replace(_key(record), last_used_at=from_us(last))
