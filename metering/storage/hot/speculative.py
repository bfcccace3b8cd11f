"""One round trip for a single event on PostgreSQL, speculating on cached rows.

`RowCache` keeps the rows `PostgresHotStore.read` returned per key, as
committed (`LearningStore`); a seat value not cached is absent, counters
have no rate, breakers are never cached. `SpeculativeStore.read` builds the
`Snapshot` from them; its `write` first sends `read`'s own statements,
compared with the cached rows by ``metering_expect`` (migration 0031), then
the writes and the COMMIT, in one pipeline. A key not cached, or a breaker:
`read` and `write` are `LearningStore`'s (``missed``), planned once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final

import psycopg

from metering.domain.rules import Key
from metering.storage.allowances import drawn_by_window, grant_deltas
from metering.storage.counters import Pair
from metering.storage.hot import Changes, ReadRequest, Snapshot
from metering.storage.hot.postgres import (
    LOCK_COUNTERS,
    LOCK_WINDOWS,
    READ_GRANTS,
    READ_SEATS,
    PostgresHotStore,
    ReadRows,
    snapshot_of,
)

# What speculation did, by outcome (``hit``, ``miss``, ``mismatch``): for benchmarks.
SPECULATION: Counter[str] = Counter()
# Below even odds, one event in this many speculates (`RowCache.worth_trying`).
PROBE: Final = 32

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _expect(rows_sql: str, columns: str, order: str) -> str:
    """A check: the rows of ``rows_sql`` (as ``q``), as a JSON array of
    ``columns`` sorted by ``order``, equal ``%(expected)s``."""
    return f"""
SELECT metering_expect(coalesce((
    SELECT jsonb_agg(jsonb_build_array({columns}) ORDER BY {order}) FROM ({rows_sql}) AS q
), '[]'::jsonb) = %(expected)s::jsonb)
"""


_C = 'COLLATE "C"'
EXPECT_VERSION: Final = (
    "SELECT metering_expect(version = %(expected)s) FROM limits_version WHERE id = 1"
)
EXPECT_WINDOWS: Final = _expect(
    LOCK_WINDOWS,
    "q.limit_name, q.subject, q.window_start_us, q.window_end_us",
    f"q.limit_name {_C}, q.subject {_C}",
)
EXPECT_COUNTERS: Final = _expect(
    LOCK_COUNTERS,
    "q.limit_name, q.subject, q.window_start_us, q.used, q.denied_count, q.denied_cost,"
    " q.first_denied_at_us, q.tat_us, q.tat_rem, q.tat_scale, q.granted",
    f"q.limit_name {_C}, q.subject {_C}, q.window_start_us",
)
EXPECT_GRANTS: Final = _expect(
    READ_GRANTS,
    "q.limit_name, q.subject, q.grant_id, q.amount, q.used, q.effective_from_us,"
    " q.expires_at_us, q.priority, q.low_at, q.low_sent",
    f"q.limit_name {_C}, q.subject {_C}, q.grant_id {_C}",
)
EXPECT_SEATS: Final = _expect(
    READ_SEATS,
    "q.limit_name, q.subject, q.window_start_us, q.value, q.live_events",
    f"q.limit_name {_C}, q.subject {_C}, q.window_start_us, q.value {_C}",
)

Row = tuple[Any, ...]
# A cached counter row: (limit, subject, window start, the 7 fields of a
# `State`, granted); a row `LOCK_COUNTERS` returned has its granted here.
_GRANTED: Final = 10
_LOCKED_GRANTED: Final = 13
SeatKey4 = tuple[str, str, int, str]


class RowCache:
    """The rows last known for each key (None: known to have no row);
    entries are replaced whole, never changed in place. Emptied when it
    holds more than ``size`` counters."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        # How often speculation paid lately (decayed): a failed one costs a
        # round trip more than a read, so below even odds only every
        # `PROBE`th event tries (rows other processes write are stale here).
        self.odds = 1.0
        self.skipped = 0
        self.windows: dict[Pair, Row | None] = {}
        self.counters: dict[Key, Row | None] = {}
        self.grants: dict[Pair, tuple[Row, ...]] = {}
        self.seats: dict[SeatKey4, Row | None] = {}

    def worth_trying(self) -> bool:
        """Whether the next event should speculate (see ``odds``)."""
        if self.odds >= 0.5:
            return True
        self.skipped += 1
        return self.skipped % PROBE == 0

    def paid(self, hit: bool) -> None:
        """Count a speculation that was written (``hit``) or not."""
        self.odds = self.odds * 0.7 + (0.3 if hit else 0.0)
        SPECULATION["hit" if hit else "mismatch"] += 1

    def rows(self, request: ReadRequest, version: int) -> ReadRows | None:
        """The rows a read of ``request`` would return, or None when one is not cached."""
        windows, counters, seats = self.windows, self.counters, self.seats
        found_windows: list[Row] = []
        found_counters: list[Row] = []
        try:
            for pair in request.pairs:
                window = windows[pair]
                if window is None:
                    continue
                found_windows.append(window)
                if window[2] is not None:
                    counter = counters[(*pair, window[2])]
                    if counter is not None:
                        found_counters.append(counter)
            for name, subject, start, _ in request.keys:
                counter = counters[(name, subject, start)]
                if counter is not None:
                    found_counters.append(counter)
            since = request.grants_since_us  # the rows `READ_GRANTS` returns
            grant_rows = [
                row
                for pair in request.grant_pairs
                for row in self.grants[pair]
                if row[4] < row[3] and (row[6] is None or row[6] > since)
            ]
            owners = set(request.grant_pairs)
            draw_rows = [
                (*c[:3], c[_GRANTED])
                for c in found_counters
                if c[_GRANTED] and (c[0], c[1]) in owners
            ]
            seat_rows: list[Row] = []
            for name, subject, seat_start, value in request.seats:
                if seat_start is None:
                    return None
                # A value not cached is taken to have no row (the first of a
                # user, mostly): the check finds out if it has one.
                seat = seats.get((name, subject, seat_start, value))
                if seat is not None:
                    seat_rows.append(seat)
        except KeyError:
            return None
        return ReadRows(
            version,
            found_windows,
            found_counters,
            grant_rows,
            draw_rows,
            seat_rows,
            grant_pairs=request.grant_pairs,
        )

    def learn(self, request: ReadRequest, rows: ReadRows, changes: Changes) -> None:
        """Keep the rows of ``request`` as ``rows`` found them and ``changes``
        left them (committed)."""
        if len(self.counters) > self.size:
            self.clear()
        windows = {pair: None for pair in request.pairs} | {
            (r[0], r[1]): tuple(r[:4]) for r in rows.windows
        }
        counters: dict[Key, Row | None] = {(n, s, start): None for n, s, start, _ in request.keys}
        granted: dict[Key, int] = {}
        for row in rows.counters:
            key = (row[0], row[1], row[2])
            # A locked row has its ``granted`` after its tuple id and rate; a cached one, tenth.
            granted[key] = row[_LOCKED_GRANTED] if len(row) > _LOCKED_GRANTED else row[_GRANTED]
            counters[key] = (*row[:10], granted[key])
        for pair, window in windows.items():
            if window is not None and window[2] is not None:
                counters.setdefault((*pair, window[2]), None)
        for pair, (start, end) in (*changes.new_windows, *changes.moved_windows):
            windows[pair] = (*pair, start, end)
        drawn = drawn_by_window(changes.draws) if changes.draws else {}
        for key, state in changes.updated:
            counters[key] = (*key, *state, granted.get(key, 0) + drawn.get(key, 0))
        for key, _, state, _ in changes.created:
            counters[key] = (*key, *state, drawn.get(key, 0))
        self.windows.update(windows)
        self.counters.update(counters)
        if request.grant_pairs:
            self._learn_grants(request.grant_pairs, rows, changes)
        if request.seats:
            seats: dict[SeatKey4, Row | None] = {
                (n, s, start, v): None for n, s, start, v in request.seats if start is not None
            }
            for row in rows.seats:
                seats[(row[0], row[1], row[2], row[3])] = tuple(row[:5])
            for seat, added in changes.seats.items():
                if seat in seats:
                    old = seats[seat]
                    seats[seat] = (*seat, added + (old[4] if old is not None else 0))
            self.seats.update(seats)

    def _learn_grants(self, pairs: Sequence[Pair], rows: ReadRows, changes: Changes) -> None:
        deltas = dict(grant_deltas(changes.draws))
        grants: dict[Pair, list[Row]] = {pair: [] for pair in pairs}
        for row in rows.grants:
            used = row[4] + deltas.get(row[2], 0)
            grants[(row[0], row[1])].append((*row[:4], used, *row[5:10]))
        for pair in pairs:
            self.grants[pair] = tuple(grants[pair])

    def forget(self, request: ReadRequest) -> None:
        """Drop the rows of ``request`` (they may have changed)."""
        for pair in request.pairs:
            window = self.windows.pop(pair, None)
            if window is not None and window[2] is not None:
                self.counters.pop((*pair, window[2]), None)
        for name, subject, start, _ in request.keys:
            self.counters.pop((name, subject, start), None)
        for pair in request.grant_pairs:
            self.grants.pop(pair, None)
        for name, subject, seat_start, value in request.seats:
            if seat_start is not None:
                self.seats.pop((name, subject, seat_start, value), None)

    def clear(self) -> None:
        self.windows, self.counters, self.seats = {}, {}, {}
        self.grants = {}


class LearningStore(PostgresHotStore):
    """`PostgresHotStore` that keeps, once its write has committed, the rows
    it read and wrote in ``cache``."""

    def __init__(self, raw: psycopg.Connection[Any], cache: RowCache) -> None:
        super().__init__(raw)
        self.cache = cache
        self.request: ReadRequest | None = None
        self.rows: ReadRows | None = None

    def read(self, request: ReadRequest) -> Snapshot:
        rows = self.read_locked(request)
        # A recurring grant's issue changes what is cached; breakers are not cached.
        if not (rows.schedules or request.breaker_pairs):
            self.request, self.rows = request, rows
        return snapshot_of(rows)

    def write(
        self,
        changes: Changes,
        now_us: int,
        *,
        commit: bool,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        super().write(changes, now_us, commit=commit, meanwhile=meanwhile)
        if commit and self.request is not None and self.rows is not None:
            self.cache.learn(self.request, self.rows, changes)


class SpeculativeStore(LearningStore):
    """A read from ``cache`` (nothing sent) and a write that checks first (see the module)."""

    keeps_stamps = False  # its rows are not read under lock

    def __init__(self, raw: psycopg.Connection[Any], cache: RowCache, version: int) -> None:
        super().__init__(raw, cache)
        self.version = version
        self.failed = False
        # A key was not cached: the rows were read, locked (see the module).
        self.missed = False

    def read(self, request: ReadRequest) -> Snapshot:
        uncached = request.ids or request.due_pairs or request.breaker_pairs
        rows = None if uncached else self.cache.rows(request, self.version)
        if rows is None:
            SPECULATION["miss"] += 1
            self.missed = True
            return super().read(request)
        self.request, self.rows = request, rows
        return snapshot_of(rows)

    def succeeded(self) -> None:
        self.cache.paid(True)

    def forget(self) -> None:
        """Forget the rows read (a decision on them declined: perhaps stale)."""
        if self.request is not None:
            self.cache.forget(self.request)

    def abandon(self) -> None:
        """After a failed write: roll back (a connection that cannot is
        closed: the pool drops it), forget the rows, count the failure."""
        self.failed = True
        self.cache.paid(False)
        self.forget()
        try:
            self.raw.rollback()
        except psycopg.Error:
            self.raw.close()

    def write(
        self,
        changes: Changes,
        now_us: int,
        *,
        commit: bool,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        """The BEGIN, the checks, the writes and the COMMIT in one pipeline,
        one sync (the connection is in autocommit: `PostgresHotStore.begins`);
        after a miss, `LearningStore.write`."""
        if not self.missed:
            assert commit, "a speculative write commits"
            assert self.begins(), "a speculative write begins its transaction"
        super().write(changes, now_us, commit=commit, meanwhile=meanwhile)

    def send_expectations(self) -> None:
        if self.missed:
            return
        request, rows = self.request, self.rows
        assert request is not None and rows is not None, "a speculative write without its read"
        cursor = self.raw.cursor()
        cursor.execute(EXPECT_VERSION, {"expected": rows.version})
        if request.pairs:
            expected = {"pairs": _encode(request.pairs), "expected": _sorted(rows.windows)}
            cursor.execute(EXPECT_WINDOWS, expected)
        expected = {
            "pairs": _encode(request.pairs),
            "keys": _encode(request.keys),
            "expected": _sorted(rows.counters),
        }
        cursor.execute(EXPECT_COUNTERS, expected)
        if request.grant_pairs:
            asked = _encode(request.grant_pairs)
            grants = {
                "grant_pairs": asked,
                "since": request.grants_since_us,
                "expected": _sorted(rows.grants, 3),
            }
            cursor.execute(EXPECT_GRANTS, grants)
        if request.seats:
            seats = {"seats": _encode(request.seats), "expected": _sorted(rows.seats, 4)}
            cursor.execute(EXPECT_SEATS, seats)


def _sorted(rows: Sequence[Sequence[Any]], width: int = 3) -> str:
    """``rows`` as the JSON array a check compares with, sorted by their first
    ``width`` columns (the checks' order: text in code point order)."""
    return _encode(sorted((list(row) for row in rows), key=lambda row: row[:width]))
