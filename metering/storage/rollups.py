"""The usage rollups' statements: adding deltas, folding them in, and the group-by report.

`record_rollups` adds, never overwrites (``INSERT ... ON CONFLICT DO UPDATE``, rows sorted by
key, after the writer's counters: waits never form a cycle). The hot path's batches and the
one-trip function append instead (``usage_rollup_deltas``, no key, no lock: `PG_APPEND` takes
the rows as one JSON array, `SQLITE_APPEND` one per execution); `compact_rollups` folds those
in. Readers sum `ROLLUPS`, both tables, by key. A delta may be negative (a voided event); a
row back at zero stays, and reports leave out all-zero groups. The report
(`usage_by_statement`) is a range of the rollups' key (subject, limit, dimension, hour, value)
and a scan of the deltas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, Select, and_, func, or_, select, text, union_all
from sqlalchemy.dialects import postgresql, sqlite

from metering.domain.rollups import Delta, RollupKey, rollup_rows
from metering.storage.tables import usage_rollup_deltas, usage_rollups

_COLUMNS: Final = "subject, limit_name, dimension, hour_start_us, value, used, events"
_KEY: Final = "subject, limit_name, dimension, hour_start_us, value"

PG_APPEND: Final = f"""
INSERT INTO usage_rollup_deltas ({_COLUMNS})
SELECT r->>0, r->>1, r->>2, (r->>3)::bigint, r->>4, (r->>5)::bigint, (r->>6)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
"""

SQLITE_APPEND: Final = f"INSERT INTO usage_rollup_deltas ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"


# Every rollup row: the compacted ones and the deltas not yet folded in. Readers sum it
# by key (a key's rows add up to its usage), never read ``usage_rollups`` alone.
ROLLUPS: Final = union_all(select(usage_rollups), select(usage_rollup_deltas)).subquery("rollups")

_FOLDED: Final = f"""
SELECT {_KEY}, sum(used), sum(events) FROM {{source}} WHERE true
GROUP BY {_KEY} ORDER BY {_KEY}
ON CONFLICT ({_KEY})
DO UPDATE SET used = usage_rollups.used + excluded.used,
              events = usage_rollups.events + excluded.events
"""
_PG_COMPACT: Final = text(
    f"WITH gone AS (DELETE FROM usage_rollup_deltas RETURNING {_COLUMNS}) "
    f"INSERT INTO usage_rollups ({_COLUMNS}) " + _FOLDED.format(source="gone")
)
_SQLITE_FOLD: Final = text(
    f"INSERT INTO usage_rollups ({_COLUMNS}) " + _FOLDED.format(source="usage_rollup_deltas")
)


def compact_rollups(connection: Connection) -> int:
    """Fold the appended deltas into ``usage_rollups``, in the caller's
    transaction: each deleted delta is added to its key's row, so every sum
    over `ROLLUPS` is the same before and after. On PostgreSQL one statement
    deletes what its snapshot sees and adds exactly that; on SQLite the
    transaction holds the write lock from its first statement on. Returns
    how many rollup rows took deltas in."""
    if connection.dialect.name == "postgresql":
        return int(connection.execute(_PG_COMPACT).rowcount)
    folded = int(connection.execute(_SQLITE_FOLD).rowcount)
    connection.execute(usage_rollup_deltas.delete())
    return folded


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
    rollups = ROLLUPS.c
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
