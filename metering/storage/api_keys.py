"""API key rows: insert, look up by id, list, revoke, note the last use.

A key is stored as its id (the visible ``mk_...`` prefix of the key), the
SHA-256 of the whole key, its scope and name, and three instants. The key
itself is never stored: `metering.apikeys` makes it, shows it once and
compares hashes. A customer's key also names its ``subject``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection, bindparam, func, insert, or_, select, update

from metering.storage.records import RecordColumns
from metering.storage.tables import api_keys


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    id: str
    secret_hash: str
    scope: str
    name: str
    created_at_us: int
    revoked_at_us: int | None
    last_used_at_us: int | None
    subject: str | None = None


_API_KEY: Final = RecordColumns(ApiKeyRecord)
# Built once: every API request with a key runs it, and building the select
# (and its cache key) again cost as much as running it.
_BY_ID: Final = select(api_keys).where(api_keys.c.id == bindparam("key_id"))


class ApiKeyStore:
    """API key queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def insert(
        self,
        key_id: str,
        secret_hash: str,
        scope: str,
        name: str,
        now_us: int,
        subject: str | None = None,
    ) -> None:
        self.connection.execute(
            insert(api_keys).values(
                id=key_id,
                secret_hash=secret_hash,
                scope=scope,
                name=name,
                created_at_us=now_us,
                subject=subject,
            )
        )

    def get(self, key_id: str) -> ApiKeyRecord | None:
        row = self.connection.execute(_BY_ID, {"key_id": key_id}).first()
        return _API_KEY.of_row(row) if row is not None else None

    def list(self) -> list[ApiKeyRecord]:
        query = select(api_keys).order_by(api_keys.c.created_at_us, api_keys.c.id)
        return [_API_KEY.of_row(row) for row in self.connection.execute(query)]

    def any(self) -> bool:
        """Whether any key was ever created (revoked ones count: rows stay)."""
        return self.connection.execute(select(api_keys.c.id).limit(1)).first() is not None

    def count(self) -> int:
        return int(self.connection.execute(select(func.count()).select_from(api_keys)).scalar_one())

    def revoke(self, key_id: str, now_us: int) -> bool:
        """Mark a key revoked; False if there is no such key or it already was."""
        result = self.connection.execute(
            update(api_keys)
            .where(api_keys.c.id == key_id, api_keys.c.revoked_at_us.is_(None))
            .values(revoked_at_us=now_us)
        )
        return bool(result.rowcount)

    def note_use(self, key_id: str, now_us: int, older_than_us: int) -> bool:
        """Set the last use to ``now_us`` if it is unset or before ``older_than_us``.

        The condition is in the statement, so processes that see the same
        stale value write the row once between them.
        """
        result = self.connection.execute(
            update(api_keys)
            .where(
                api_keys.c.id == key_id,
                or_(
                    api_keys.c.last_used_at_us.is_(None),
                    api_keys.c.last_used_at_us < older_than_us,
                ),
            )
            .values(last_used_at_us=now_us)
        )
        return bool(result.rowcount)
