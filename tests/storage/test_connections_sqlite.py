"""What every SQLite connection runs first: WAL, the busy timeout, and exp()
for the counters' rates, Python's when the SQLite build has no math functions."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

from metering.storage.connections import SQLITE_BUSY_TIMEOUT_MS, sqlite_pragmas


def test_a_connection_is_in_wal_with_the_busy_timeout_and_exp(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    sqlite_pragmas(connection, "NORMAL")
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert connection.execute("PRAGMA busy_timeout").fetchone()[0] == SQLITE_BUSY_TIMEOUT_MS
    assert connection.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert math.isclose(connection.execute("SELECT exp(-0.5)").fetchone()[0], math.exp(-0.5))


class _NoMathCursor:
    """A cursor of a build without SQLite's math functions: exp() is unknown."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self.cursor = cursor

    def execute(self, sql: str) -> Any:
        if "exp(" in sql:
            raise sqlite3.OperationalError("no such function: exp")
        return self.cursor.execute(sql)

    def close(self) -> None:
        self.cursor.close()


class _NoMathConnection:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.registered: list[str] = []

    def cursor(self) -> _NoMathCursor:
        return _NoMathCursor(self.connection.cursor())

    def create_function(self, name: str, arity: int, function: Any, **options: Any) -> None:
        self.registered.append(name)
        self.connection.create_function(name, arity, function, **options)


def test_without_math_functions_python_s_exp_is_registered(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    wrapped = _NoMathConnection(connection)
    sqlite_pragmas(wrapped, "NORMAL")  # type: ignore[arg-type]
    assert wrapped.registered == ["exp"]
    assert math.isclose(connection.execute("SELECT exp(-2.0)").fetchone()[0], math.exp(-2.0))
