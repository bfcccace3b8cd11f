"""The hot path on SQLite: the sqlite3 connection directly, prepared statements.

The transaction is ``BEGIN IMMEDIATE`` (see `engine`): it holds SQLite's one
write lock from the start, so reading is locking. Statements are fixed
strings, which sqlite3 keeps compiled in its statement cache.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, Final

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, StatementError

from metering.domain.rollups import rollup_rows
from metering.domain.windows import Window
from metering.storage.allowances import AllowanceStore
from metering.storage.hot import Changes, Snapshot, WantedKey
from metering.storage.queries import Pair, record_from_row, result_row
from metering.storage.rollups import SQLITE_UPSERT

VERSION: Final = "SELECT version FROM limits_version WHERE id = 1"
FETCH_RESULT: Final = """
SELECT event_id, outcome, fingerprint, occurred_at_us, decided_at_us, denied_by, reason,
       charges, metadata
FROM results WHERE event_id = ?
"""
SELECT_WINDOW: Final = """
SELECT window_start_us, window_end_us FROM current_windows WHERE limit_name = ? AND subject = ?
"""
SELECT_COUNTER: Final = """
SELECT used, denied_count, denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale
FROM counters WHERE limit_name = ? AND subject = ? AND window_start_us = ?
"""
UPDATE_COUNTER: Final = """
UPDATE counters SET used = ?, denied_count = ?, denied_cost = ?, first_denied_at_us = ?,
                    tat_us = ?, tat_rem = ?, tat_scale = ?, updated_at_us = ?
WHERE limit_name = ? AND subject = ? AND window_start_us = ?
"""
INSERT_COUNTER: Final = """
INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, denied_count,
                      denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale, updated_at_us)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
UPSERT_WINDOW: Final = """
INSERT INTO current_windows (limit_name, subject, window_start_us, window_end_us)
VALUES (?, ?, ?, ?)
ON CONFLICT (limit_name, subject)
DO UPDATE SET window_start_us = excluded.window_start_us, window_end_us = excluded.window_end_us
"""
INSERT_RESULT: Final = """
INSERT INTO results (event_id, outcome, fingerprint, occurred_at_us, decided_at_us, denied_by,
                     reason, charges, metadata)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


class SqliteHotStore:
    """`HotStore` on the sqlite3 connection under a SQLAlchemy transaction."""

    def __init__(self, connection: Connection) -> None:
        raw = connection.connection.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        self.raw = raw
        self.connection = connection

    def read(
        self,
        ids: Sequence[str] | None,
        pairs: Sequence[Pair],
        keys: Sequence[WantedKey],
        now_us: int,
        grant_pairs: Sequence[Pair] = (),
    ) -> Snapshot:
        raw = self.raw
        try:
            (version,) = raw.execute(VERSION).fetchone()
            stored = {}
            for event_id in ids or ():
                row = raw.execute(FETCH_RESULT, (event_id,)).fetchone()
                if row is not None:
                    stored[event_id] = record_from_row(row)
            windows: dict[Pair, Window | None] = {}
            wanted = [key[:3] for key in keys]
            for pair in pairs:
                row = raw.execute(SELECT_WINDOW, pair).fetchone()
                windows[pair] = (row[0], row[1]) if row is not None and row[0] is not None else None
                current = windows[pair]
                if current is not None:
                    wanted.append((pair[0], pair[1], current[0]))
            states = {}
            for key in wanted:
                row = raw.execute(SELECT_COUNTER, key).fetchone()
                if row is not None:
                    states[key] = list(row)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        # The transaction holds SQLite's one write lock already.
        pots = AllowanceStore(self.connection).lock_pots(grant_pairs, None) if grant_pairs else {}
        return Snapshot(version, stored, windows, states, pots)

    def write(self, changes: Changes, now_us: int, *, commit: bool) -> None:
        # ``commit`` is left to the caller's transaction: SQLite has no round trip to save.
        raw = self.raw
        try:
            if changes.updated:
                raw.executemany(UPDATE_COUNTER, _updates(changes, now_us))
            if changes.created:
                rows = [(*key, end, *state, now_us) for key, end, state in changes.created]
                raw.executemany(INSERT_COUNTER, rows)
            windows = [*changes.new_windows, *changes.moved_windows]
            if windows:
                raw.executemany(UPSERT_WINDOW, [(*pair, *window) for pair, window in windows])
            if changes.results:
                raw.executemany(INSERT_RESULT, [result_row(r) for r in changes.results])
            if changes.draws:
                AllowanceStore(self.connection).write_draws(changes.draws)
            if changes.rollups:
                raw.executemany(SQLITE_UPSERT, rollup_rows(changes.rollups))
        except sqlite3.Error as exc:
            # `run_transaction` runs again after a key written meanwhile, and
            # only then: any other constraint would fail the same way again.
            raise _translate(exc) from exc


def _updates(changes: Changes, now_us: int) -> Iterator[tuple[Any, ...]]:
    for key, state in changes.updated:
        yield (*state, now_us, *key)


def _translate(exc: sqlite3.Error) -> StatementError:
    return DBAPIError.instance(None, None, exc, sqlite3.Error)
