"""The usage rollups' statements: adding deltas, and the group-by report.

`record_rollups` adds, never overwrites (``INSERT ... ON CONFLICT DO UPDATE SET used = used
+ excluded.used``): two transactions rolling up the same row both count, the second waiting
for the first's row lock. Writers send rows sorted by key (`metering.domain.rollups.rollup_rows`)
and, on the hot path, after their counters, so waits never form a cycle. A delta may be
negative (a voided event); a row back at zero stays, and reports leave out all-zero groups.
The hot path sends the same upsert in its own write: `PG_UPSERT` takes the rows as one JSON
array, `SQLITE_UPSERT` one row per execution. The report (`usage_by_statement`) is an index
range on the primary key (subject, limit, dimension, hour, value), summed in the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, Select, and_, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from metering.domain.rollups import Delta, RollupKey, rollup_rows
from metering.storage.tables import usage_rollups

_COLUMNS: Final = "subject, limit_name, dimension, hour_start_us, value, used, events"
_KEY: Final = "subject, limit_name, dimension, hour_start_us, value"

PG_UPSERT: Final = f"""
INSERT INTO usage_rollups ({_COLUMNS})
SELECT r->>0, r->>1, r->>2, (r->>3)::bigint, r->>4, (r->>5)::bigint, (r->>6)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
ON CONFLICT ({_KEY})
DO UPDATE SET used = usage_rollups.used + excluded.used,
              events = usage_rollups.events + excluded.events
"""

SQLITE_UPSERT: Final = f"""
INSERT INTO usage_rollups ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT ({_KEY})
DO UPDATE SET used = used + excluded.used, events = events + excluded.events
"""


def _upsert(dialect: str) -> Any:
    module = postgresql if dialect == "postgresql" else sqlite
    statement = module.insert(usage_rollups)
    return statement.on_conflict_do_update(
        index_elements=[c.name for c in usage_rollups.primary_key.columns],
        set_={
            "used": usage_rollups.c.used + statement.excluded.used,
            "events": usage_rollups.c.events + statement.excluded.events,
        },
    )


_UPSERTS: Final = {name: _upsert(name) for name in ("postgresql", "sqlite")}
_NAMES: Final = ("subject", "limit_name", "dimension", "hour_start_us", "value", "used", "events")


def record_rollups(connection: Connection, deltas: Mapping[RollupKey, Delta]) -> None:
    """Add ``deltas`` (`metering.domain.rollups.rollup_deltas`) to the rollups,
    in the caller's transaction. Negative deltas subtract (a voided event).

    Call it after the transaction has locked the counters it changes, as
    every writer does: rollup rows are then always locked last, in key
    order, and waits cannot form a cycle.
    """
    rows = rollup_rows(deltas)
    if rows:
        params = [dict(zip(_NAMES, row, strict=True)) for row in rows]
        connection.execute(_UPSERTS[connection.dialect.name], params)


@dataclass(frozen=True, slots=True)
class DimensionQuery:
    """What the group-by report selects: one subject's usage of ``limits`` by
    the values of ``dimension``, over hours starting in ``[since_us, until_us)``
    (None: unbounded)."""

    subject: str
    dimension: str
    limits: Sequence[str]
    since_us: int | None = None
    until_us: int | None = None


def usage_by_statement(query: DimensionQuery) -> Select[Any]:
    """(limit, value, used, events) per limit and value, the largest use first."""
    rollups = usage_rollups.c
    conditions = [
        rollups.subject == query.subject,
        rollups.limit_name.in_(list(query.limits)),
        rollups.dimension == query.dimension,
    ]
    if query.since_us is not None:
        conditions.append(rollups.hour_start_us >= query.since_us)
    if query.until_us is not None:
        conditions.append(rollups.hour_start_us < query.until_us)
    used = func.sum(rollups.used)
    events = func.sum(rollups.events)
    return (
        select(rollups.limit_name, rollups.value, used.label("used"), events.label("events"))
        .where(and_(*conditions))
        .group_by(rollups.limit_name, rollups.value)
        .having(or_(used != 0, events != 0))  # everything there was, voided
        .order_by(used.desc(), events.desc(), rollups.limit_name, rollups.value)
    )


def count_of(statement: Select[Any]) -> Select[Any]:
    """How many rows ``statement`` gives."""
    return select(func.count()).select_from(statement.order_by(None).subquery())
