"""The hot path on SQLite: the stdlib sqlite3 connection, prepared statements.

The transaction is ``BEGIN IMMEDIATE``: it holds SQLite's one write lock
from the start, so reading is locking. Statements are fixed strings, which
sqlite3 keeps compiled in its statement cache; rows are tuples.

`DirectSqlite` runs the hot path's transactions on connections of its own,
with no SQLAlchemy `Connection` or transaction object: a small pool of
stdlib connections to the same file, set up as the engine's
(`metering.storage.connections.sqlite_pragmas`), retried and translated as
`metering.storage.connections.run_retry_aware` does. A `SqliteHotStore` it hands
out has no SQLAlchemy connection. A check (`sqlite_read_unlocked`) reads in
a plain ``BEGIN`` (`DirectSqlite.reading`): a WAL snapshot, no write lock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Final, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, StatementError

from metering.domain.breaker import Breaker, breaker_of
from metering.domain.distinct import Seen
from metering.domain.grants import Pot
from metering.domain.rollups import appended_rows
from metering.domain.rules import Key, State
from metering.domain.windows import Window
from metering.storage.allowances import drawn_by_window
from metering.storage.connections import (
    SQLITE_BUSY_TIMEOUT_MS,
    RetryTransaction,
    refused_overflow,
    retry_or_raise,
    sqlite_pragmas,
    sqlite_synchronous,
    translate,
)
from metering.storage.counters import Pair
from metering.storage.hot import Changes, ReadRequest, Snapshot, WantedSeat
from metering.storage.hot.extras import (
    BREAKER_SECRET,
    SQLITE_BREAKER_ROWS,
    sqlite_breakers,
    sqlite_secret,
    sqlite_write_extras,
)
from metering.storage.hot.sqlite_grants import (
    GRANT_ROWS,
    Rowids,
    due_schedules,
    pot_of_rows,
    read_grants,
    with_draws,
    write_draws,
    write_issues,
)
from metering.storage.hot.statements import (
    RESULT_COLUMNS,
    VERSION,
    Statements,
    counter_insert,
    counter_update,
    seat_rows,
)
from metering.storage.reservations import ReservationRecord, record_of_row
from metering.storage.results import ResultRecord, record_from_row, result_row
from metering.storage.rollups import SQLITE_APPEND

FETCH_RESULT: Final = f"SELECT {RESULT_COLUMNS} FROM results WHERE event_id = ?"
# A batch's ids, and its counters, each in one statement: the values come as
# one JSON array (`json_each`), so the statement stays one cached string.
FETCH_RESULTS: Final = f"""
SELECT {RESULT_COLUMNS} FROM results WHERE event_id IN (SELECT value FROM json_each(?))
"""
SELECT_COUNTERS: Final = """
SELECT c.limit_name, c.subject, c.window_start_us, c.used, c.denied_count, c.denied_cost,
       c.first_denied_at_us, c.tat_us, c.tat_rem, c.tat_scale, c.rate, c.rate_at_us, c.granted,
       c.seats_stamp
FROM json_each(?) AS k
JOIN counters AS c ON c.limit_name = json_extract(k.value, '$[0]')
                  AND c.subject = json_extract(k.value, '$[1]')
                  AND c.window_start_us = json_extract(k.value, '$[2]')
"""
# The same for the counters of one limit and window start (most batches'
# are one or a few such groups): their subjects as one JSON array, so that
# no key is parsed out of JSON per row (about a third less for 430 counters).
SELECT_GROUP: Final = """
SELECT c.subject, c.used, c.denied_count, c.denied_cost, c.first_denied_at_us, c.tat_us,
       c.tat_rem, c.tat_scale, c.rate, c.rate_at_us, c.granted, c.seats_stamp
FROM json_each(?1) AS k CROSS JOIN counters AS c
WHERE c.limit_name = ?2 AND c.subject = k.value AND c.window_start_us = ?3
"""
SELECT_WINDOW: Final = """
SELECT window_start_us, window_end_us FROM current_windows WHERE limit_name = ? AND subject = ?
"""
SELECT_WINDOWS: Final = """
SELECT w.limit_name, w.subject, w.window_start_us, w.window_end_us
FROM json_each(?) AS k
JOIN current_windows AS w ON w.limit_name = json_extract(k.value, '$[0]')
                         AND w.subject = json_extract(k.value, '$[1]')
"""
# Up to this many ids, windows or seat values are read one statement each,
# and as many counters in one statement (`FOLDED`: `consume`).
_ONE_BY_ONE: Final = 3
# The version and one counter (or none: the LEFT JOIN's NULLs) in one statement.
VERSION_AND_COUNTER: Final = """
SELECT v.version, c.used, c.denied_count, c.denied_cost, c.first_denied_at_us, c.tat_us,
       c.tat_rem, c.tat_scale, c.rate, c.rate_at_us, c.granted, c.seats_stamp
FROM limits_version AS v
LEFT JOIN counters AS c ON c.limit_name = ? AND c.subject = ? AND c.window_start_us = ?
WHERE v.id = 1
"""
# The same with a kind (0) first, and what else one event reads, each part
# padded to its thirteen columns: one pair's grants (`GRANT_ROWS`, kind 1;
# their draws are the counters' ``granted``), one breaker and the secret
# (`SQLITE_BREAKER_ROWS`, 3 and 4), one seat value's live events (kind 5),
# and its other counters (`_COUNTER_ROW`, kind 6, each with its position).
# `FOLDED` has a statement per choice of parts: (grants, breaker, seat, how
# many other counters).
_KINDED: Final = """
SELECT 0, v.version, c.used, c.denied_count, c.denied_cost, c.first_denied_at_us, c.tat_us,
       c.tat_rem, c.tat_scale, c.rate, c.rate_at_us, c.granted, c.seats_stamp
FROM limits_version AS v
LEFT JOIN counters AS c ON c.limit_name = ? AND c.subject = ? AND c.window_start_us = ?
WHERE v.id = 1
"""
_SEAT_ROW: Final = """
UNION ALL
SELECT 5, live_events, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM distinct_values
WHERE subject = ? AND limit_name = ? AND window_start_us = ? AND value = ?
"""
_COUNTER_ROW: Final = """
UNION ALL
SELECT 6, ?, used, denied_count, denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale,
       rate, rate_at_us, granted, seats_stamp
FROM counters WHERE limit_name = ? AND subject = ? AND window_start_us = ?
"""
FOLDED: Final = {
    (grants, breaker, seat, more): _KINDED
    + (GRANT_ROWS if grants else "")
    + (SQLITE_BREAKER_ROWS if breaker else "")
    + (_SEAT_ROW if seat else "")
    + _COUNTER_ROW * more
    for grants in (False, True)
    for breaker in (False, True)
    for seat in (False, True)
    for more in range(_ONE_BY_ONE)
}
_BREAKER, _SECRET, _SEAT, _COUNTER = 3, 4, 5, 6  # kinds of `FOLDED`'s rows
SELECT_SEATS: Final = """
SELECT v.subject, v.limit_name, v.window_start_us, v.value, v.live_events
FROM json_each(?) AS k
JOIN distinct_values AS v ON v.subject = json_extract(k.value, '$[0]')
                         AND v.limit_name = json_extract(k.value, '$[1]')
                         AND v.window_start_us = json_extract(k.value, '$[2]')
                         AND v.value = json_extract(k.value, '$[3]')
"""
# The same grouped by limit and window start: each subject's values as one
# JSON object of arrays ({subject: [value, ...]}).
SELECT_SEAT_GROUP: Final = """
SELECT s.key, x.value, v.live_events
FROM json_each(?1) AS s CROSS JOIN json_each(s.value) AS x CROSS JOIN distinct_values AS v
WHERE v.subject = s.key AND v.limit_name = ?2 AND v.window_start_us = ?3 AND v.value = x.value
"""
# The held values of one seat window: a range of the primary key.
SELECT_HELD: Final = """
SELECT value FROM distinct_values
WHERE subject = ? AND limit_name = ? AND window_start_us = ? AND live_events > 0
"""
UPSERT_WINDOW: Final = """
INSERT INTO current_windows (limit_name, subject, window_start_us, window_end_us)
VALUES (?, ?, ?, ?)
ON CONFLICT (limit_name, subject)
DO UPDATE SET window_start_us = excluded.window_start_us, window_end_us = excluded.window_end_us
"""
SQL: Final = Statements.of("?")

T = TypeVar("T")


class SqliteHotStore:
    """`HotStore` on a sqlite3 connection: a SQLAlchemy connection's own,
    under its transaction, or one of `DirectSqlite` (``connection`` None)."""

    # Dead letters go through SQLAlchemy after `write` (`metering.engine.fast`).
    takes_rejected = False
    keeps_stamps = True
    # A single seat value rides with the first counter (`FOLDED`): a few
    # microseconds of SQLite, less than the cache's work for it.
    folds_one_seat = True

    def __init__(
        self, connection: Connection | None, raw: sqlite3.Connection | None = None
    ) -> None:
        if raw is None:
            assert connection is not None
            raw = connection.connection.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        self.raw = raw
        self.connection = connection
        self.rowids = Rowids()  # the grants' and breakers' rows `read` read, for `write`

    def read(self, request: ReadRequest) -> Snapshot:
        raw, seats, grants_since_us = self.raw, request.seats, request.grants_since_us
        grant_pairs, breaker_pairs = request.grant_pairs, request.breaker_pairs
        self.rowids.breakers.clear()  # (a pair not read now: written by its key)
        try:
            # The transaction holds SQLite's one write lock already.
            schedules = due_schedules(raw, request.due_pairs) if request.due_pairs else []
            stored = _stored(raw, request.ids) if request.ids else {}
            windows: dict[Pair, Window | None] = {}
            wanted = [key[:3] for key in request.keys]
            for pair, current in _windows(raw, request.pairs):
                windows[pair] = current
                if current is not None:
                    wanted.append((pair[0], pair[1], current[0]))
            states: dict[Key, State] = {}
            rates: dict[Key, tuple[float, int]] = {}
            pots: dict[Pair, Pot] = {}
            watched: dict[str, tuple[int, int]] = {}
            seen: Seen = {}
            breakers: dict[Pair, Breaker] = {}
            secret: str | None = None
            drawn: dict[Key, int] = {}  # the counters' ``granted`` (what grants paid)
            stamps: dict[Key, int] = {}  # their seat windows' (`HeldCache`)
            # One event's (`consume`) grants, breaker, seat and other
            # counters (a few) ride with its first counter.
            grant = grant_pairs[0] if wanted and len(grant_pairs) == 1 else None
            breaker = breaker_pairs[0] if wanted and len(breaker_pairs) == 1 else None
            seat = _fixed_seat(seats[0]) if wanted and len(seats) == 1 else None
            more = len(wanted) - 1 if 1 < len(wanted) <= _ONE_BY_ONE else 0
            if grant or breaker or seat or more:
                parameters: list[Any] = [*wanted[0]]
                if grant:
                    parameters += (*grant, grants_since_us)
                if breaker:
                    parameters += (*breaker, BREAKER_SECRET)
                if seat:
                    name, subject, start, value = seat
                    parameters += (subject, name, start, value)  # as `_seen` reads it
                for position in range(1, more + 1):
                    parameters += (position, *wanted[position])
                statement = FOLDED[grant is not None, breaker is not None, seat is not None, more]
                (_, version, *first), *rest = raw.execute(statement, parameters).fetchall()
                if grant:
                    pot_of_rows(grant, rest, pots, watched, self.rowids)
                for row in rest:
                    if row[0] == _COUNTER:
                        _keep_counter(wanted[row[1]], row[2:], states, rates, drawn, stamps)
                    elif row[0] == _BREAKER and breaker:
                        breakers[breaker] = breaker_of(row[1:7])
                        self.rowids.breakers[breaker] = row[7]
                    elif row[0] == _SECRET:
                        secret = str(row[1])
                    elif row[0] == _SEAT and seat:
                        seen[seat] = row[1]
                if first[0] is not None:
                    _keep_counter(wanted[0], first, states, rates, drawn, stamps)
            elif wanted:
                # The first counter rides with the version (one statement for `consume`).
                version, *first = raw.execute(VERSION_AND_COUNTER, wanted[0]).fetchone()
                if first[0] is not None:  # ``used`` is NOT NULL: the row exists
                    _keep_counter(wanted[0], first, states, rates, drawn, stamps)
            else:
                (version,) = raw.execute(VERSION).fetchone()
            if len(wanted) > _ONE_BY_ONE:
                for key, row in _counters(raw, wanted[1:]):
                    _keep_counter(key, row, states, rates, drawn, stamps)
            if seats and seat is None:
                seen = _seen(raw, seats, windows)
            if grant_pairs and grant is None:
                pots, watched = read_grants(raw, grant_pairs, self.rowids, grants_since_us)
            if breaker_pairs and breaker is None:
                breakers = sqlite_breakers(raw, breaker_pairs, self.rowids.breakers)
                secret = sqlite_secret(raw, BREAKER_SECRET)
            if drawn and pots:
                with_draws(pots, drawn)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return Snapshot(
            version,
            stored,
            windows,
            states,
            pots,
            seen=seen,
            watched=watched,
            schedules=schedules,
            rates=rates,
            breakers=breakers,
            secret=secret,
            stamps=stamps,
        )

    def read_seats(self, seats: Sequence[WantedSeat]) -> Seen:
        """The live events of ``seats`` (each with its window start) that
        have a row, in `read`'s transaction."""
        try:
            return _seen(self.raw, seats, {})
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def read_held(self, keys: Sequence[Key]) -> dict[Key, set[str]]:
        """The held values of the seat windows ``keys``, by window."""
        found: dict[Key, set[str]] = {}
        try:
            for name, subject, start in keys:
                rows = self.raw.execute(SELECT_HELD, (subject, name, start)).fetchall()
                if rows:
                    found[(name, subject, start)] = {row[0] for row in rows}
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return found

    def looking_up(self, ids: Sequence[str] | None) -> AbstractContextManager[None]:
        """Nothing sent ahead: `read` looks the ids up, in process."""
        return nullcontext()

    def sending(self) -> AbstractContextManager[None]:
        """Nothing sent while deciding: `write` inserts the results, in process."""
        return nullcontext()

    def lock_reservation(self, reservation_id: str) -> ReservationRecord | None:
        # The transaction holds SQLite's one write lock already.
        try:
            row = self.raw.execute(SQL.select_reservation, (reservation_id,)).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return record_of_row(row) if row is not None else None

    def write(
        self,
        changes: Changes,
        now_us: int,
        *,
        commit: bool,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        # ``commit`` is left to the caller's transaction: SQLite has no round
        # trip to save, nor to wait for (``meanwhile`` is not called).
        raw = self.raw
        try:
            # One row (`consume`): `execute`, which costs less than `executemany`.
            drawn = drawn_by_window(changes.draws) if changes.draws else {}
            if changes.updated:
                rows = [counter_update(k, st, now_us, drawn.get(k, 0)) for k, st in changes.updated]
                _execute(raw, SQL.update_counter, rows)
            if changes.created:
                rows = [
                    counter_insert(k, end, st, now_us, m, drawn.get(k, 0))
                    for k, end, st, m in changes.created
                ]
                _execute(raw, SQL.insert_counter, rows)
            windows = [*changes.new_windows, *changes.moved_windows]
            if windows:
                _execute(raw, UPSERT_WINDOW, [(*pair, *window) for pair, window in windows])
            if changes.results:
                _execute(raw, SQL.insert_result, [result_row(r) for r in changes.results])
            if changes.holds:
                _execute(raw, SQL.insert_hold, changes.holds)
            if changes.settled:
                _execute(raw, SQL.settle_reservation, changes.settled)
            if changes.seats:
                _execute(raw, SQL.add_seat, seat_rows(changes.seats))
            if changes.issues:  # before the draws: they may draw on them
                write_issues(raw, changes.issues, now_us)
            if changes.draws:  # `grant.low` is the caller's (`metering.engine.fast`)
                write_draws(raw, changes.draws, self.rowids)
            if changes.breakers or changes.low or changes.notices:
                extras = (changes.breakers, changes.low, changes.notices)
                sqlite_write_extras(raw, *extras, now_us, changes.secret, self.rowids.breakers)
            if changes.rollups:
                _execute(raw, SQLITE_APPEND, appended_rows(changes.rollups))
        except sqlite3.Error as exc:
            # `run_transaction` runs again after a key written meanwhile, and
            # only then: any other constraint would fail the same way again.
            raise _translate(exc) from exc


def sqlite_read_unlocked(raw: sqlite3.Connection, request: ReadRequest) -> Snapshot:
    """`SqliteHotStore.read` for a decision that writes nothing (`check`), in
    `DirectSqlite.reading`'s read transaction: no write lock. A check's
    ``request`` asks for no results nor recurring grants' schedules (``ids``
    None, ``due_pairs`` empty). Driver errors come out as SQLAlchemy's."""
    return SqliteHotStore(None, raw).read(request)


def _windows(raw: sqlite3.Connection, pairs: Sequence[Pair]) -> list[tuple[Pair, Window | None]]:
    """The current first-use window of each of ``pairs`` that has a row, in
    order (None: a row with no window); a pair with no row is left out."""
    if len(pairs) > _ONE_BY_ONE:
        rows = raw.execute(SELECT_WINDOWS, (json.dumps(pairs),))
        found = {(r[0], r[1]): (r[2], r[3]) if r[2] is not None else None for r in rows}
        return [(pair, found[pair]) for pair in pairs if pair in found]
    windows: list[tuple[Pair, Window | None]] = []
    for pair in pairs:
        row = raw.execute(SELECT_WINDOW, pair).fetchone()
        if row is not None:
            windows.append((pair, (row[0], row[1]) if row[0] is not None else None))
    return windows


def _fixed_seat(seat: WantedSeat) -> tuple[str, str, int, str] | None:
    """``seat`` when its window's start is known (a calendar window's), else None."""
    name, subject, start, value = seat
    return None if start is None else (name, subject, start, value)


def _stored(raw: sqlite3.Connection, ids: Sequence[str]) -> dict[str, ResultRecord]:
    """The stored results of ``ids`` (those decided already)."""
    if len(ids) > _ONE_BY_ONE:
        rows = raw.execute(FETCH_RESULTS, (json.dumps(ids),)).fetchall()
    else:
        found = (raw.execute(FETCH_RESULT, (event_id,)).fetchone() for event_id in ids)
        rows = [row for row in found if row is not None]
    return {row[0]: record_from_row(row) for row in rows}


def _seen(
    raw: sqlite3.Connection, seats: Sequence[WantedSeat], windows: dict[Pair, Window | None]
) -> Seen:
    """The live events of ``seats`` that have a row (a first-use window's:
    in the pair's current window)."""
    wanted: list[tuple[str, str, int, str]] = []
    for name, subject, start, value in seats:
        if start is None:
            current = windows.get((name, subject))
            if current is None:
                continue  # no window yet: no value has a row
            start = current[0]
        wanted.append((subject, name, start, value))
    if len(wanted) > _ONE_BY_ONE:
        groups: dict[tuple[str, int], dict[str, list[str]]] = {}
        for subject, name, start, value in wanted:
            groups.setdefault((name, start), {}).setdefault(subject, []).append(value)
        if len(groups) > _GROUPS:
            rows = raw.execute(SELECT_SEATS, (json.dumps(wanted),))
            return {(name, subject, start, value): n for subject, name, start, value, n in rows}
        found: Seen = {}
        for (name, start), values in groups.items():
            for subject, value, n in raw.execute(
                SELECT_SEAT_GROUP, (json.dumps(values), name, start)
            ):
                found[(name, subject, start, value)] = n
        return found
    seen: Seen = {}
    for subject, name, start, value in wanted:
        row = raw.execute(SQL.select_seat, (subject, name, start, value)).fetchone()
        if row is not None:
            seen[(name, subject, start, value)] = row[0]
    return seen


# Up to this many (limit, window start) groups are read one statement each
# (`SELECT_GROUP`, `SELECT_SEAT_GROUP`); more (first-use windows: a start
# per pair) in one statement of whole keys.
_GROUPS: Final = 8


def _keep_counter(
    key: Key,
    row: Sequence[Any],
    states: dict[Key, State],
    rates: dict[Key, tuple[float, int]],
    drawn: dict[Key, int],
    stamps: dict[Key, int],
) -> None:
    """Keep a counter's row as read (its state's seven columns, its rate and
    the rate's time, what its window drew on grants, its seat window's
    stamp) in `read`'s maps."""
    states[key] = list(row[:7])
    rates[key] = (row[7], row[8])
    if row[9]:
        drawn[key] = row[9]
    if row[10] is not None:
        stamps[key] = row[10]


def _counters(
    raw: sqlite3.Connection, wanted: Sequence[tuple[str, str, int]]
) -> Iterator[tuple[Key, Sequence[Any]]]:
    """The rows of those of ``wanted`` counters that exist, each with its key:
    its state's seven columns, then its rate and the rate's time, what its
    window drew on grants (``granted``) and its seat window's stamp."""
    groups: dict[tuple[str, int], list[str]] = {}
    for name, subject, start in wanted:
        groups.setdefault((name, start), []).append(subject)
    if len(groups) > _GROUPS:
        for row in raw.execute(SELECT_COUNTERS, (json.dumps(wanted),)):
            yield row[:3], row[3:]
        return
    for (name, start), subjects in groups.items():
        for row in raw.execute(SELECT_GROUP, (json.dumps(subjects), name, start)):
            yield (name, row[0], start), row[1:]


def _execute(raw: sqlite3.Connection, statement: str, rows: list[tuple[Any, ...]]) -> None:
    if len(rows) == 1:
        raw.execute(statement, rows[0])
    else:
        raw.executemany(statement, rows)


def _translate(exc: sqlite3.Error) -> StatementError:
    return DBAPIError.instance(None, None, exc, sqlite3.Error)


class DirectSqlite:
    """The hot path's own sqlite3 connections to one database file.

    A connection is used by one thread at a time: `run` takes one from the
    pool (or opens one) and gives it back when its transaction has ended.
    A process forked from this one never uses its parent's connections: it
    leaves them open and untouched (closing a parent's connection in a child
    is unsafe in SQLite) and opens its own. `close` closes the idle ones and
    the busy ones when they come back.
    """

    IDLE: Final = 8  # connections kept open while idle

    def __init__(self, path: str) -> None:
        self.path = path
        self.synchronous = sqlite_synchronous()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: deque[sqlite3.Connection] = deque()
        self._open: set[sqlite3.Connection] = set()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_engine(cls, engine: Engine) -> DirectSqlite | None:
        """For a SQLite engine on a plain file; None otherwise (PostgreSQL,
        an in-memory database, a URL with options)."""
        url = engine.url
        if engine.dialect.name != "sqlite" or url.query:
            return None
        if not url.database or url.database == ":memory:" or url.database.startswith("file:"):
            return None
        return cls(url.database)

    def _connect(self) -> sqlite3.Connection:
        # Shared across threads one at a time (the pool), never at once.
        raw = sqlite3.connect(
            self.path,
            timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            sqlite_pragmas(raw, self.synchronous)
        except BaseException:
            raw.close()
            raise
        with self._lock:
            self._open.add(raw)
        return raw

    def _checkout(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # forked: the parent's connections stay untouched
            _ABANDONED.extend(self._open)
            self._reset()
        try:
            return self._idle.pop()
        except IndexError:
            return self._connect()

    def _checkin(self, raw: sqlite3.Connection) -> None:
        # (No fork check: `_checkout` made this process's pool, and a thread
        # that forks inside a transaction continues only in one process.)
        if self._closed or len(self._idle) >= self.IDLE:
            self._discard(raw)
        else:
            self._idle.append(raw)

    def _discard(self, raw: sqlite3.Connection) -> None:
        with self._lock:
            self._open.discard(raw)
        raw.close()

    def run(self, work: Callable[[SqliteHotStore, bool], T], *, attempts: int = 10) -> T:
        """Run ``work(store, retry)`` in one ``BEGIN IMMEDIATE`` transaction,
        committed when it returns; run again as `run_retry_aware` would (a
        busy database, a key written meanwhile, `RetryTransaction`), driver
        errors raised as `metering.errors` exceptions. Anything else ``work``
        raises rolls back and propagates."""
        for attempt in range(attempts):
            try:
                raw = self._checkout()
            except sqlite3.Error as exc:  # e.g. the file cannot be opened
                retry_or_raise(_translate(exc), attempt, attempts)
                continue
            began = time.monotonic()
            try:
                try:
                    raw.execute("BEGIN IMMEDIATE")
                    result = work(SqliteHotStore(None, raw), attempt > 0)
                    raw.execute("COMMIT")
                except BaseException:
                    if raw.in_transaction:
                        raw.execute("ROLLBACK")
                    raise
            except (RetryTransaction, StatementError) as exc:
                self._checkin(raw)
                retry_or_raise(exc, attempt, attempts)
                continue
            except sqlite3.Error as exc:
                # A failed ROLLBACK leaves the connection unusable: drop it.
                if raw.in_transaction:
                    self._discard(raw)
                else:
                    self._checkin(raw)
                retry_or_raise(_translate(exc), attempt, attempts, began=began)
                continue
            except OverflowError as exc:  # rolled back above
                self._checkin(raw)
                raise refused_overflow(exc) from exc
            except BaseException:
                if raw.in_transaction:
                    self._discard(raw)
                else:
                    self._checkin(raw)
                raise
            self._checkin(raw)
            return result
        raise AssertionError("unreachable")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A pooled connection in a read transaction (``BEGIN``: a WAL
        snapshot that takes no write lock), rolled back at the end: for work
        that writes nothing (`check`).

        Not retried: driver errors (raw, or as `SqliteHotStore` raises them)
        come out as `metering.errors.StorageError`."""
        try:
            raw = self._checkout()
        except sqlite3.Error as exc:
            raise translate(_translate(exc)) from exc
        try:
            raw.execute("BEGIN")
            yield raw
        except sqlite3.Error as exc:
            raise translate(_translate(exc)) from exc
        except StatementError as exc:
            raise translate(exc) from exc
        finally:
            self._end_reading(raw)

    def _end_reading(self, raw: sqlite3.Connection) -> None:
        """Roll back a read transaction; a connection that cannot is dropped."""
        try:
            if raw.in_transaction:
                raw.execute("ROLLBACK")
        except sqlite3.Error:
            self._discard(raw)
            return
        self._checkin(raw)

    def close(self) -> None:
        """Close every connection of this process (those in use when they come back)."""
        if self._pid != os.getpid():
            return
        self._closed = True
        while self._idle:
            self._discard(self._idle.pop())


# Connections a forked child inherited: kept referenced so that they are
# never closed (nor finalised) in the child.
_ABANDONED: list[sqlite3.Connection] = []
