"""The limits table, its version and its dimensions' history: `LimitStore` loads, lists,
writes and deletes limit rows; every write bumps ``limits_version`` (`BUMP_LIMITS_VERSION`),
which tells the hot path's cache to reload. `LimitStore.hold_decisions` makes a definition
wait for the decisions of the limit it changes; `LimitStore.record_dimensions` appends what
it changes to ``limit_dimensions`` at a new tick of the reset clock, ordered with every
decision (`metering.domain.dimension_history`); `LimitStore.record_definitions` appends a
change of the default maximum or enforcement to ``limit_definitions`` at its instant, which
reports read (`metering.domain.definitions`). A deletion keeps both histories."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Final

from sqlalchemy import bindparam, delete, insert, select, text, update

from metering.domain import definitions
from metering.domain.definitions import Definition
from metering.domain.dimension_history import Era
from metering.domain.limits import Limit
from metering.storage.counters import ADVANCE_RESET_CLOCK
from metering.storage.limit_rows import limit_from_row, limit_row
from metering.storage.on_connection import OnConnection
from metering.storage.tables import limit_definitions, limit_dimensions, limits, limits_version

BUMP_LIMITS_VERSION: Final = (
    update(limits_version)
    .where(limits_version.c.id == 1)
    .values(version=limits_version.c.version + 1)
)

# With the version's row: the decisions that read limits here (the general
# engine's) take its table's lock, which a change of a limit waits for.
# How long a change of a limit waits for the decisions under way before
# it starts over (milliseconds; a batch's transaction is shorter).
DEFINITION_LOCK_MS: Final = 500

# Taken first by every definition of limits (PostgreSQL): conflicts with
# itself and with writes of the history, never with its readers.
SERIAL_DEFINITIONS: Final = "LOCK TABLE limit_dimensions IN SHARE ROW EXCLUSIVE MODE"

LOAD_LIMITS: Final = (
    select(limits)
    .join(limits_version, limits_version.c.id == 1)
    .where(limits.c.name.in_(bindparam("names", expanding=True)))
)
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

    def hold_decisions(self, chosen: Sequence[Limit]) -> None:
        """First of a definition of ``chosen`` (PostgreSQL; SQLite's writers
        are serial, ``BEGIN IMMEDIATE``): definitions one at a time (the
        history's own lock, which no reader waits for), then, when one
        changes a limit defined before (deleted since, too), ``limits_version``
        in ACCESS EXCLUSIVE mode. Every decision reads the version (the
        general engine with its limits, `LOAD_LIMITS`) before it writes its
        result, which reads the reset clock's tick: the lock waits for every
        decision made by the old definition and holds new ones off till the
        change commits. So what a change checks (held reservations, usage in
        a window) misses no decision of the old definition, and a result
        decided with the old dimensions has a smaller tick than the new
        era's. A first definition, or the same one again, waits for nothing."""
        if not self._postgres:
            return
        self.connection.execute(text(SERIAL_DEFINITIONS))
        names = sorted({limit.name for limit in chosen})
        query = select(limits).where(limits.c.name.in_(names))
        stored = {row.name: limit_from_row(row) for row in self.connection.execute(query)}
        defined = stored.keys() | self.dimension_history(names).keys()
        if any(limit.name in defined and stored.get(limit.name) != limit for limit in chosen):
            # Waiting, it holds every decision queued behind it: it yields
            # instead (a lock timeout, retried by `run_transaction`).
            self.connection.exec_driver_sql(f"SET LOCAL lock_timeout = {DEFINITION_LOCK_MS}")
            self.connection.execute(text("LOCK TABLE limits_version IN ACCESS EXCLUSIVE MODE"))
            self.connection.exec_driver_sql("SET LOCAL lock_timeout TO DEFAULT")

    def record_dimensions(self, chosen: Sequence[Limit], now_us: int) -> None:
        """Append to the history the dimensions (and seat key, aggregation) of each of
        ``chosen`` that its last era lacks (or that has none), before they
        are written, after `hold_decisions`."""
        changed = self._new_dimensions(chosen)
        if not changed:
            return
        tick = self.connection.execute(ADVANCE_RESET_CLOCK[self._dialect]).scalar_one()
        rows = [
            {
                "limit_name": limit.name,
                "tick": tick,
                "since_us": now_us,
                "dimensions": json.dumps(list(limit.dimensions)),
                "distinct_key": limit.distinct,
                "aggregation": limit.aggregation,
            }
            for limit in changed
        ]
        self.connection.execute(insert(limit_dimensions), rows)

    def _new_dimensions(self, chosen: Sequence[Limit]) -> list[Limit]:
        """Those of ``chosen`` whose dimensions, seat key or aggregation to append."""
        history = self.dimension_history(limit.name for limit in chosen)
        return [
            limit
            for limit in {limit.name: limit for limit in chosen}.values()
            if limit.name not in history
            or sorted(history[limit.name][-1].dimensions) != sorted(limit.dimensions)
            or history[limit.name][-1].distinct != limit.distinct
            or history[limit.name][-1].aggregation != limit.aggregation
        ]

    def dimension_history(self, names: Iterable[str] | None = None) -> dict[str, list[Era]]:
        """Each limit's eras, by tick, of ``names`` (None: every limit's)."""
        d = limit_dimensions.c
        query = select(
            d.limit_name, d.tick, d.since_us, d.dimensions, d.seeded, d.distinct_key, d.aggregation
        )
        if names is not None:
            wanted = sorted(set(names))
            if not wanted:
                return {}
            query = query.where(d.limit_name.in_(wanted))
        found: dict[str, list[Era]] = {}
        for name, tick, since_us, keys, seeded, distinct, aggregation in self.connection.execute(
            query.order_by(d.limit_name, d.tick)
        ):
            dimensions = tuple(json.loads(keys))
            era = Era(int(tick), int(since_us), dimensions, bool(seeded), distinct, aggregation)
            found.setdefault(name, []).append(era)
        return found

    def record_definitions(self, chosen: Sequence[Limit], now_us: int) -> None:
        """Append to the definitions' history the maximum and enforcement of
        each of ``chosen`` that differ from its latest (or that has none),
        from ``now_us``; a change at the same instant replaces it. Runs after
        `hold_decisions`, whose lock makes definitions serial."""
        latest = {limit.name: limit for limit in chosen}
        history = self.definition_history(latest)
        for limit in latest.values():
            found = history.get(limit.name, [])
            if definitions.changed(found, limit.maximum, limit.enforcement):
                self._upsert(
                    limit_definitions,
                    {
                        "limit_name": limit.name,
                        "effective_from_us": now_us,
                        "maximum": limit.maximum,
                        "enforcement": limit.enforcement,
                    },
                    key=["limit_name", "effective_from_us"],
                )

    def definition_history(self, names: Iterable[str] | None = None) -> dict[str, list[Definition]]:
        """Each limit's definitions, oldest first, of ``names`` (None: every limit's)."""
        d = limit_definitions.c
        query = select(d.limit_name, d.effective_from_us, d.maximum, d.enforcement)
        if names is not None:
            wanted = sorted(set(names))
            if not wanted:
                return {}
            query = query.where(d.limit_name.in_(wanted))
        found: dict[str, list[Definition]] = {}
        for name, since_us, maximum, enforcement in self.connection.execute(
            query.order_by(d.limit_name, d.effective_from_us)
        ):
            found.setdefault(name, []).append(Definition(int(since_us), int(maximum), enforcement))
        return found

    def ever_dimensioned(self) -> frozenset[str]:
        """The limits whose history has dimensions in some era."""
        d = limit_dimensions.c
        query = select(d.limit_name).where(d.dimensions != "[]").distinct()
        return frozenset(self.connection.execute(query).scalars())
