"""The statements both hot stores share (`storage/hot/statements.py`): one
placeholder filled in everywhere, run here on a migrated SQLite database
through sqlite3; seat rows in the subject-first key order."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import fields

from metering.domain.forecast import TAU_SECONDS
from metering.storage.hot.statements import (
    Statements,
    counter_insert,
    counter_update,
    seat_rows,
)


def test_the_placeholder_is_filled_in_every_statement() -> None:
    question, percent = Statements.of("?"), Statements.of("%s")
    for field in fields(Statements):
        text = getattr(question, field.name)
        assert "{0}" not in text and "%s" not in text, field.name
        assert text.replace("?", "%s") == getattr(percent, field.name), field.name


def test_seat_rows_are_subject_first_and_sorted() -> None:
    added = {("seats", "org-b", 0, "u1"): 1, ("seats", "org-a", 5, "u2"): 2}
    assert seat_rows(added) == [("org-a", "seats", 5, "u2", 2), ("org-b", "seats", 0, "u1", 1)]
    assert seat_rows({}) == []


def test_counters_and_seats_are_written_and_read_on_sqlite(sqlite_url: str) -> None:
    statements = Statements.of("?")
    connection = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        key = ("calls", "org", 100)
        state = (3, 1, 2, 150, None, 0, 1)
        connection.execute(statements.insert_counter, counter_insert(key, 900, state, 7))
        connection.execute(
            statements.update_counter, counter_update(key, (5, 2, 4, 150, None, 0, 1), 8)
        )
        row = connection.execute(
            "SELECT used, denied_count, denied_cost, window_end_us, updated_at_us, rate_at_us"
            " FROM counters"
        ).fetchall()
        assert row == [(5, 2, 4, 900, 8, 8)]
        # 3 units at 7, 2 more at 8: the rate of each, the first decayed a microsecond.
        rate = connection.execute("SELECT rate FROM counters").fetchone()[0]
        expected = 3 / TAU_SECONDS * math.exp(-1e-6 / TAU_SECONDS) + 2 / TAU_SECONDS
        assert math.isclose(rate, expected, rel_tol=1e-12)

        for seat in seat_rows({("seats", "org", 100, "u1"): 1}) * 2:
            connection.execute(statements.add_seat, seat)
        seat_key = ("org", "seats", 100, "u1")
        assert connection.execute(statements.select_seat, seat_key).fetchall() == [(2,)]
        assert (
            connection.execute(statements.select_seat, ("org", "seats", 100, "u2")).fetchall() == []
        )
    finally:
        connection.close()
