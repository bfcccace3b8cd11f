"""The limits table and its version: `LimitStore` loads, lists, writes and
deletes limit rows; every write bumps ``limits_version`` (`BUMP_LIMITS_VERSION`),
which tells the hot path's cache to reload."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Final

from sqlalchemy import bindparam, delete, select, update

from metering.domain.limits import Limit
from metering.storage.limit_rows import limit_from_row
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
        values = limit.to_dict()
        values["thresholds"] = json.dumps(values["thresholds"])
        values["dimensions"] = json.dumps(values["dimensions"])
        values["thresholds_units"] = json.dumps(values["thresholds_units"])
        values.pop("max_amount", None)  # the maximum holds it, in minor units
        values["currency"] = limit.currency  # None turns a spend limit back into units
        values["distinct_key"] = values.pop("distinct")
        values.pop("pacing", None)
        values.pop("burst", None)
        values["pacing_burst"] = str(limit.burst) if limit.pacing else None
        values["forecast_lead"] = limit.forecast_lead
        values["breaker"] = limit.breaker
        values["breaker_floor"] = limit.breaker_floor
        values["quarantine_max"] = limit.quarantine_max
        values["updated_at_us"] = now_us
        self._upsert(limits, values, key=["name"])
        self.connection.execute(BUMP_LIMITS_VERSION)

    def delete_limit(self, name: str) -> bool:
        outcome = self.connection.execute(delete(limits).where(limits.c.name == name))
        self.connection.execute(BUMP_LIMITS_VERSION)
        return bool(outcome.rowcount)

    def limits_version(self) -> int:
        return int(self.connection.execute(LIMITS_VERSION).scalar_one())
