"""The limits table and its version: `LimitStore` loads, lists, writes and
deletes limit rows; every write bumps ``limits_version`` (`BUMP_LIMITS_VERSION`),
which tells the hot path's cache to reload."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sqlalchemy import bindparam, delete, select, update

from metering.domain.limits import Limit
from metering.storage.limit_rows import limit_from_row, limit_row
from metering.storage.on_connection import OnConnection
from metering.storage.tables import limits, limits_version

BUMP_LIMITS_VERSION: Final = (
    update(limits_version)
    .where(limits_version.c.id == 1)
    .values(version=limits_version.c.version + 1)
)

LOAD_LIMITS: Final = select(limits).where(limits.c.name.in_(bindparam("names", expanding=True)))
# What the hot path's cache reads on every reload, built once: a statement
# used again needs no new cache key, and compiles once per engine.
LIST_LIMITS: Final = select(limits).order_by(limits.c.name)
LIMITS_VERSION: Final = select(limits_version.c.version).where(limits_version.c.id == 1)


class LimitStore(OnConnection):
    """Limit rows on one connection; the caller owns the transaction."""

    def load_limits(self, names: Iterable[str]) -> dict[str, Limit]:
        wanted = sorted(set(names))
        if not wanted:
            return {}
        rows = self.connection.execute(LOAD_LIMITS, {"names": wanted})
        return {row.name: limit_from_row(row) for row in rows}

    def list_limits(self) -> list[Limit]:
        rows = self.connection.execute(LIST_LIMITS)
        return [limit_from_row(row) for row in rows]

    def limit_names(self) -> frozenset[str]:
        return frozenset(self.connection.execute(select(limits.c.name)).scalars())

    def upsert_limit(self, limit: Limit, now_us: int) -> None:
        self._upsert(limits, limit_row(limit, now_us), key=["name"])
        self.connection.execute(BUMP_LIMITS_VERSION)

    def delete_limit(self, name: str) -> bool:
        outcome = self.connection.execute(delete(limits).where(limits.c.name == name))
        self.connection.execute(BUMP_LIMITS_VERSION)
        return bool(outcome.rowcount)

    def limits_version(self) -> int:
        return int(self.connection.execute(LIMITS_VERSION).scalar_one())
