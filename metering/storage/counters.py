"""Counters and first-use windows: `CounterStore` creates, locks, reads,
writes and resets the rows of ``counters`` and ``current_windows`` (and, on a
reset, what the cleared windows drew on grants; `resets_after` for voids).

Keys are locked in sorted order so that transactions touching overlapping
counters cannot deadlock: first-use windows by (limit, subject), then
counters by (limit, subject, window start), one statement each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    delete,
    insert,
    literal_column,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite

from metering.domain.corrections import CounterOf, Reset
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import Window
from metering.domain.zones import ZoneHistory, billing_month
from metering.storage.distinct import DistinctStore
from metering.storage.on_connection import OnConnection, chunks
from metering.storage.rates import rate_set
from metering.storage.records import RecordColumns
from metering.storage.tables import (
    counter_resets,
    counters,
    current_windows,
    reset_clock,
    results,
    subject_time_zones,
)

Pair = tuple[str, str]  # (limit name, subject)

_COUNTER_KEY: Final = ("limit_name", "subject", "window_start_us")
_RATE: Final = ("rate", "rate_at_us")
# Written once, when the row is made (`billing_months`).
_MADE: Final = ("billing_month",)
# Writing back a locked counter moves its rate (`metering.storage.rates`):
# the existing row's columns, the written ``used`` and instant.
_RATE_EXPRESSIONS: Final = rate_set(
    now="excluded.updated_at_us", new_used="excluded.used", row="counters."
).split(",\n    rate_at_us = ")
_RATE_UPSERT: Final[dict[str, Any]] = {
    "rate": literal_column(_RATE_EXPRESSIONS[0].removeprefix("rate = ")),
    "rate_at_us": literal_column(_RATE_EXPRESSIONS[1]),
}


def _advance_reset_clock(dialect: str) -> Any:
    """The reset clock's next tick (`metering.storage.tables.reset_clock`);
    the row is made on first use where a schema lacks it."""
    upsert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    first = upsert(reset_clock).values(id=1, tick=1)
    return first.on_conflict_do_update(
        index_elements=["id"], set_={"tick": reset_clock.c.tick + 1}
    ).returning(reset_clock.c.tick)


ADVANCE_RESET_CLOCK: Final = {name: _advance_reset_clock(name) for name in ("postgresql", "sqlite")}


def _build_statements(dialect: str) -> dict[str, Any]:
    """The hot-path counter and window statements, built once per dialect so
    SQLAlchemy compiles them once and psycopg can prepare them. Each runs as an executemany: with
    RETURNING, SQLAlchemy sends it as multi-row VALUES ("insertmanyvalues")."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    new_counters = insert(counters)
    lock_counters = new_counters.on_conflict_do_update(
        index_elements=["limit_name", "subject", "window_start_us"],
        set_={"updated_at_us": new_counters.excluded.updated_at_us},
    ).returning(*counters.c)
    new_windows = insert(current_windows)
    lock_windows = new_windows.on_conflict_do_update(
        index_elements=["limit_name", "subject"],
        set_={"limit_name": new_windows.excluded.limit_name},
    ).returning(*current_windows.c)
    # Writing back locked counters is the same upsert: every row exists, so
    # ON CONFLICT always updates, and a batch is one multi-row statement.
    # (A window's draws, ``granted``, are added to where they are drawn: `AllowanceStore`.)
    kept = (*_COUNTER_KEY, *_RATE, *_MADE, "granted", "seats_stamp")
    state_columns = [c.name for c in counters.c if c.name not in kept]
    write_counters = new_counters.on_conflict_do_update(
        index_elements=list(_COUNTER_KEY),
        set_={
            **{name: new_counters.excluded[name] for name in state_columns},
            **_RATE_UPSERT,
        },
    )
    write_windows = new_windows.on_conflict_do_update(
        index_elements=["limit_name", "subject"],
        set_={
            "window_start_us": new_windows.excluded.window_start_us,
            "window_end_us": new_windows.excluded.window_end_us,
        },
    )
    return {
        "lock_counters": lock_counters,
        "lock_windows": lock_windows,
        "write_counters": write_counters,
        "write_windows": write_windows,
    }


# PostgreSQL's bulk forms of the hot statements: one array per column, so the
# statement text is fixed whatever the batch size (prepared once, planned
# once) and the driver sends 12 parameters instead of 12 per row. Rows are
# handled in the order given (WITH ORDINALITY), which the caller sorts.
_PG_COUNTER_STATE = (
    "used, denied_count, denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale"
)
PG_LOCK_COUNTERS: Final = f"""
INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, denied_count,
                      denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale, updated_at_us,
                      billing_month)
SELECT k.l, k.s, k.ws, k.we, 0, 0, 0, NULL, NULL, 0, 1, %(now)s, k.m
FROM unnest(%(l)s::text[], %(s)s::text[], %(ws)s::bigint[], %(we)s::bigint[], %(m)s::text[])
     WITH ORDINALITY AS k(l, s, ws, we, m, n)
ORDER BY k.n
ON CONFLICT (limit_name, subject, window_start_us)
DO UPDATE SET updated_at_us = excluded.updated_at_us
RETURNING limit_name, subject, window_start_us, window_end_us, {_PG_COUNTER_STATE}
"""
PG_WRITE_COUNTERS: Final = f"""
UPDATE counters AS c
SET used = v.used, denied_count = v.dc, denied_cost = v.dcost, first_denied_at_us = v.fd,
    tat_us = v.tat, tat_rem = v.rem, tat_scale = v.scale, updated_at_us = %(now)s,
    {rate_set(now="%(now)s", new_used="v.used", row="c.")}
FROM unnest(%(l)s::text[], %(s)s::text[], %(ws)s::bigint[], %(used)s::bigint[],
            %(dc)s::bigint[], %(dcost)s::bigint[], %(fd)s::bigint[], %(tat)s::bigint[],
            %(rem)s::bigint[], %(scale)s::bigint[])
     AS v(l, s, ws, used, dc, dcost, fd, tat, rem, scale)
WHERE c.limit_name = v.l AND c.subject = v.s AND c.window_start_us = v.ws
"""
PG_LOCK_WINDOWS: Final = """
INSERT INTO current_windows (limit_name, subject)
SELECT k.l, k.s FROM unnest(%(l)s::text[], %(s)s::text[]) WITH ORDINALITY AS k(l, s, n)
ORDER BY k.n
ON CONFLICT (limit_name, subject) DO UPDATE SET limit_name = excluded.limit_name
RETURNING limit_name, subject, window_start_us, window_end_us
"""
PG_WRITE_WINDOWS: Final = """
UPDATE current_windows AS w SET window_start_us = v.ws, window_end_us = v.we
FROM unnest(%(l)s::text[], %(s)s::text[], %(ws)s::bigint[], %(we)s::bigint[]) AS v(l, s, ws, we)
WHERE w.limit_name = v.l AND w.subject = v.s
"""


_STATEMENTS: Final = {name: _build_statements(name) for name in ("postgresql", "sqlite")}


_COUNTER_STATE: Final = RecordColumns(CounterState)


def _key_from_row(row: Any) -> CounterKey:
    return CounterKey(row.limit_name, row.subject, row.window_start_us, row.window_end_us)


def billing_months(
    keys: Iterable[CounterKey], zones: Mapping[str, ZoneHistory]
) -> list[str | None]:
    """Each counter's billing month (`metering.domain.zones.billing_month`), in
    the order of ``keys``; None for a token bucket (no window)."""
    return [
        None
        if key.window_end_us == NO_WINDOW
        else billing_month(zones.get(key.subject, ()), key.window_start_us)
        for key in keys
    ]


# How long an operator's reset waits for a row a consume holds before it
# starts over (milliseconds).
RESET_LOCK_TIMEOUT_MS: Final = 200


class CounterStore(OnConnection):
    """Counters and first-use windows on one connection; the caller owns the transaction."""

    # -- first-use windows -------------------------------------------------

    def lock_current_windows(self, pairs: Iterable[Pair]) -> dict[Pair, Window | None]:
        """Create-or-lock each pair's current-window row, in sorted order."""
        ordered = sorted(set(pairs))
        if not ordered:
            return {}
        if self._bulk(len(ordered)):
            arrays = {"l": [p[0] for p in ordered], "s": [p[1] for p in ordered]}
            rows: Any = self.connection.exec_driver_sql(PG_LOCK_WINDOWS, arrays)
        else:
            params = [
                {"limit_name": lim, "subject": sub, "window_start_us": None, "window_end_us": None}
                for lim, sub in ordered
            ]
            rows = self.connection.execute(_STATEMENTS[self._dialect]["lock_windows"], params)
        found: dict[Pair, Window | None] = {}
        for row in rows:
            window = None
            if row.window_start_us is not None:
                window = (row.window_start_us, row.window_end_us)
            found[(row.limit_name, row.subject)] = window
        return found

    def read_current_windows(self, pairs: Iterable[Pair]) -> dict[Pair, Window | None]:
        wanted = sorted(set(pairs))
        found: dict[Pair, Window | None] = dict.fromkeys(wanted)
        for chunk in chunks(wanted):
            query = select(current_windows).where(
                tuple_(current_windows.c.limit_name, current_windows.c.subject).in_(chunk)
            )
            for row in self.connection.execute(query):
                if row.window_start_us is not None:
                    found[(row.limit_name, row.subject)] = (row.window_start_us, row.window_end_us)
        return found

    def write_current_windows(self, windows: Mapping[Pair, Window]) -> None:
        if not windows:
            return
        items = sorted(windows.items())
        if self._bulk(len(items)):
            arrays = {
                "l": [pair[0] for pair, _ in items],
                "s": [pair[1] for pair, _ in items],
                "ws": [window[0] for _, window in items],
                "we": [window[1] for _, window in items],
            }
            self.connection.exec_driver_sql(PG_WRITE_WINDOWS, arrays)
            return
        params = [
            {
                "limit_name": limit,
                "subject": subject,
                "window_start_us": start,
                "window_end_us": end,
            }
            for (limit, subject), (start, end) in items
        ]
        self.connection.execute(_STATEMENTS[self._dialect]["write_windows"], params)

    def windows_around(self, pair: Pair, at_us: int) -> tuple[Window | None, Window | None]:
        """For a late event: the latest window starting at or before it, and the next one."""
        limit, subject = pair
        mine = and_(
            counters.c.limit_name == limit,
            counters.c.subject == subject,
            counters.c.window_start_us != NO_WINDOW,
        )
        before = self.connection.execute(
            select(counters.c.window_start_us, counters.c.window_end_us)
            .where(mine, counters.c.window_start_us <= at_us)
            .order_by(counters.c.window_start_us.desc())
            .limit(1)
        ).first()
        after = self.connection.execute(
            select(counters.c.window_start_us, counters.c.window_end_us)
            .where(mine, counters.c.window_start_us > at_us)
            .order_by(counters.c.window_start_us)
            .limit(1)
        ).first()
        latest = (before.window_start_us, before.window_end_us) if before else None
        return latest, ((after.window_start_us, after.window_end_us) if after else None)

    # -- counters ------------------------------------------------------------

    def lock_counters(
        self,
        keys: Iterable[CounterKey],
        now_us: int,
        zones: Mapping[str, ZoneHistory] | None = None,
    ) -> dict[CounterKey, CounterState]:
        """Create missing counters, lock every one, and return their states.

        This is the atomic upsert. On PostgreSQL ``ON CONFLICT DO UPDATE``
        takes the row lock and returns the latest committed row even at READ
        COMMITTED, so concurrent transactions queue here, one per counter.
        A row made here gets its billing month from its subject's ``zones``
        (read here when None).
        """
        ordered = sorted(set(keys), key=lambda k: (k.limit, k.subject, k.window_start_us))
        if not ordered:
            return {}
        if zones is None:
            zones = self._zones({k.subject for k in ordered})
        months = billing_months(ordered, zones)
        if self._bulk(len(ordered)):
            arrays = {
                "l": [k.limit for k in ordered],
                "s": [k.subject for k in ordered],
                "ws": [k.window_start_us for k in ordered],
                "we": [k.window_end_us for k in ordered],
                "m": months,
                "now": now_us,
            }
            rows = self.connection.exec_driver_sql(PG_LOCK_COUNTERS, arrays)
            return {_key_from_row(row): _COUNTER_STATE.of_row(row) for row in rows}
        params = [
            {
                "limit_name": k.limit,
                "subject": k.subject,
                "window_start_us": k.window_start_us,
                "window_end_us": k.window_end_us,
                "used": 0,
                "denied_count": 0,
                "denied_cost": 0,
                "first_denied_at_us": None,
                "tat_us": None,
                "tat_rem": 0,
                "tat_scale": 1,
                "updated_at_us": now_us,
                "billing_month": month,
            }
            for k, month in zip(ordered, months, strict=True)
        ]
        rows = self.connection.execute(_STATEMENTS[self._dialect]["lock_counters"], params)
        return {_key_from_row(row): _COUNTER_STATE.of_row(row) for row in rows}

    def _zones(self, subjects: set[str]) -> dict[str, ZoneHistory]:
        """The changes of zone of those of ``subjects`` that have one, oldest first."""
        z = subject_time_zones.c
        found: dict[str, list[tuple[int, str]]] = {}
        for chunk in chunks(sorted(subjects)):
            query = select(z.subject, z.since_us, z.time_zone).where(z.subject.in_(chunk))
            for subject, since_us, zone in self.connection.execute(query.order_by(z.since_us)):
                found.setdefault(subject, []).append((since_us, zone))
        return {subject: tuple(changes) for subject, changes in found.items()}

    def read_counters(self, keys: Iterable[CounterKey]) -> dict[CounterKey, CounterState]:
        """Counters as they are, without locking (for `check`); missing ones are fresh."""
        wanted = sorted(set(keys), key=lambda k: (k.limit, k.subject, k.window_start_us))
        states = {key: CounterState() for key in wanted}
        columns = (counters.c.limit_name, counters.c.subject, counters.c.window_start_us)
        for chunk in chunks(wanted):
            ids = [(k.limit, k.subject, k.window_start_us) for k in chunk]
            for row in self.connection.execute(select(counters).where(tuple_(*columns).in_(ids))):
                states[_key_from_row(row)] = _COUNTER_STATE.of_row(row)
        return states

    def read_rates(self, keys: Iterable[CounterKey]) -> dict[CounterKey, tuple[int, float, int]]:
        """``used``, the rate (units per second) and its instant of those of
        ``keys`` that have a row (`metering.domain.forecast`)."""
        wanted = sorted(set(keys), key=lambda k: (k.limit, k.subject, k.window_start_us))
        by_id = {(k.limit, k.subject, k.window_start_us): k for k in wanted}
        c = counters.c
        found: dict[CounterKey, tuple[int, float, int]] = {}
        for chunk in chunks(list(by_id)):
            key = (c.limit_name, c.subject, c.window_start_us)
            query = select(*key, c.used, c.rate, c.rate_at_us).where(tuple_(*key).in_(chunk))
            for row in self.connection.execute(query):
                found[by_id[(row[0], row[1], row[2])]] = (row[3], row[4], row[5])
        return found

    def write_counters(self, states: Mapping[CounterKey, CounterState], now_us: int) -> None:
        """Write back counters this transaction has locked, in one statement."""
        if not states:
            return
        if self._bulk(len(states)):
            items = list(states.items())
            arrays = {
                "l": [k.limit for k, _ in items],
                "s": [k.subject for k, _ in items],
                "ws": [k.window_start_us for k, _ in items],
                "used": [st.used for _, st in items],
                "dc": [st.denied_count for _, st in items],
                "dcost": [st.denied_cost for _, st in items],
                "fd": [st.first_denied_at_us for _, st in items],
                "tat": [st.tat_us for _, st in items],
                "rem": [st.tat_rem for _, st in items],
                "scale": [st.tat_scale for _, st in items],
                "now": now_us,
            }
            self.connection.exec_driver_sql(PG_WRITE_COUNTERS, arrays)
            return
        params = [
            {
                "limit_name": key.limit,
                "subject": key.subject,
                "window_start_us": key.window_start_us,
                "window_end_us": key.window_end_us,
                "used": state.used,
                "denied_count": state.denied_count,
                "denied_cost": state.denied_cost,
                "first_denied_at_us": state.first_denied_at_us,
                "tat_us": state.tat_us,
                "tat_rem": state.tat_rem,
                "tat_scale": state.tat_scale,
                "updated_at_us": now_us,
            }
            for key, state in sorted(
                states.items(),
                key=lambda item: (item[0].limit, item[0].subject, item[0].window_start_us),
            )
        ]
        self.connection.execute(_STATEMENTS[self._dialect]["write_counters"], params)

    def delete_current_counters(
        self, subject: str | None, limit: str | None, now_us: int
    ) -> set[CounterOf]:
        """Remove counters of current windows and buckets (operator reset);
        the counters removed.

        Every counter of the scope is cleared, whatever a concurrent
        transaction did to it: on PostgreSQL its key is locked first and the
        row deleted by key, so a row updated while the lock waited is found
        again (a row's tuple id changes on update; its key does not).
        """
        live = or_(counters.c.window_end_us > now_us, counters.c.window_start_us == NO_WINDOW)
        which_counters: list[ColumnElement[bool]] = [live]
        which_windows: list[ColumnElement[bool]] = []
        if subject is not None:
            which_counters.append(counters.c.subject == subject)
            which_windows.append(current_windows.c.subject == subject)
        if limit is not None:
            which_counters.append(counters.c.limit_name == limit)
            which_windows.append(current_windows.c.limit_name == limit)
        if self._postgres:
            removed = self._delete_locked(which_windows, which_counters)
        else:  # SQLite: BEGIN IMMEDIATE already holds the only write lock
            self.connection.execute(delete(current_windows).where(*which_windows))
            removed = self._delete_counters(*which_counters)
        DistinctStore(self.connection).forget_cleared(subject, limit)
        return removed

    def _delete_locked(
        self, which_windows: list[ColumnElement[bool]], which_counters: list[ColumnElement[bool]]
    ) -> set[CounterOf]:
        """Lock as `consume` does, windows then counters, each sorted, then
        delete exactly the keys locked: a plain DELETE locks in scan order, and
        met a consume's opposite order in a deadlock. One wait remains: a
        consume that found no window, locked a counter and then inserts the
        window a reset is deleting. The reset yields (a lock timeout, retried
        by `run_transaction`) well before the server's deadlock check would
        stall both for 1 s."""
        self.connection.exec_driver_sql(f"SET LOCAL lock_timeout = {RESET_LOCK_TIMEOUT_MS}")
        w, c = current_windows.c, counters.c
        pairs = self._lock_keys(
            select(w.limit_name, w.subject)
            .where(*which_windows)
            .order_by(w.limit_name.collate("C"), w.subject.collate("C"))
        )
        for chunk in chunks(pairs):
            self.connection.execute(
                delete(current_windows).where(tuple_(w.limit_name, w.subject).in_(chunk))
            )
        keys = self._lock_keys(
            select(c.limit_name, c.subject, c.window_start_us)
            .where(*which_counters)
            .order_by(c.limit_name.collate("C"), c.subject.collate("C"), c.window_start_us)
        )
        removed: set[CounterOf] = set()
        for chunk in chunks(keys):
            removed |= self._delete_counters(
                tuple_(c.limit_name, c.subject, c.window_start_us).in_(chunk)
            )
        return removed

    def _delete_counters(self, *which: ColumnElement[bool]) -> set[CounterOf]:
        c = counters.c
        deleted = (
            delete(counters).where(*which).returning(c.subject, c.limit_name, c.window_start_us)
        )
        return {
            (row.subject, row.limit_name, row.window_start_us)
            for row in self.connection.execute(deleted)
        }

    def _lock_keys(self, query: Select[Any]) -> list[tuple[Any, ...]]:
        """The keys ``query`` selects, each row locked. A row updated while
        the lock waited is checked again in its new version (READ COMMITTED);
        one deleted meanwhile is left out."""
        return [tuple(row) for row in self.connection.execute(query.with_for_update())]

    def record_reset(self, cleared: Iterable[CounterOf], at_us: int) -> None:
        """Remember a reset for voids (`resets_after`): advance the reset
        clock, then one row per counter cleared, at the new tick. Called
        with the cleared counters still locked, so every result written to
        one of them before holds a smaller tick and every one after a
        greater or equal one. A reset that cleared nothing records nothing."""
        keys = sorted(set(cleared))
        if not keys:
            return
        tick = self.connection.execute(ADVANCE_RESET_CLOCK[self._dialect]).scalar_one()
        rows = [
            {"subject": s, "limit_name": lim, "window_start_us": w, "reset_at_us": at_us}
            | {"tick": tick}
            for s, lim, w in keys
        ]
        self.connection.execute(insert(counter_resets), rows)

    def resets_after(
        self, event_id: str, decided_at_us: int, keys: Iterable[CounterKey]
    ) -> list[Reset]:
        """The resets written after ``event_id``'s result (a greater tick)
        that may have cleared one of ``keys`` (an event's: at most
        `MAX_CHARGES`). Rows of earlier versions have no tick: they count
        when timed at or after the decision, ``decided_at_us``, and may
        lack a subject or limit (every one)."""
        r = counter_resets.c
        keys = list(keys)
        written = select(results.c.reset_tick).where(results.c.event_id == event_id)
        query = select(r.subject, r.limit_name, r.reset_at_us, r.window_start_us).where(
            or_(
                r.tick > written.scalar_subquery(),
                and_(r.tick.is_(None), r.reset_at_us >= decided_at_us),
            ),
            or_(r.subject.is_(None), r.subject.in_({key.subject for key in keys})),
            or_(r.limit_name.is_(None), r.limit_name.in_({key.limit for key in keys})),
        )
        return [Reset(*row) for row in self.connection.execute(query)]

    def used_in_windows_after(self, limit: str, at_us: int) -> bool:
        """Whether a window of ``limit`` that ends after ``at_us`` has usage counted."""
        query = select(counters.c.used).where(
            counters.c.limit_name == limit,
            counters.c.window_end_us > at_us,
            counters.c.used > 0,
        )
        return self.connection.execute(query.limit(1)).first() is not None

    def counters_of(
        self, subject: str | None, limit: str | None
    ) -> list[tuple[CounterKey, CounterState]]:
        query = select(counters).order_by(
            counters.c.subject, counters.c.limit_name, counters.c.window_start_us
        )
        if subject is not None:
            query = query.where(counters.c.subject == subject)
        if limit is not None:
            query = query.where(counters.c.limit_name == limit)
        return [
            (_key_from_row(r), _COUNTER_STATE.of_row(r)) for r in self.connection.execute(query)
        ]
