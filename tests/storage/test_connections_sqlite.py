"""What every SQLite connection runs first: WAL, the busy timeout, and exp()
for the counters' rates, Python's when the SQLite build has no math functions;
a write that waited out the whole busy timeout is not run again."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metering import Limit, Meter
from metering.errors import DatabaseUnavailable
from metering.storage import connections
from metering.storage.connections import SQLITE_BUSY_TIMEOUT_MS, sqlite_pragmas
from metering.telemetry.metrics import exposition


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


def _busy_retries() -> float:
    body, _ = exposition()
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "metering_db_retries_total" and sample.labels.get("reason") == "busy"
    )


def test_a_write_lock_held_a_whole_busy_timeout_fails_at_once_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection holding the write lock for the whole busy timeout:
    the write fails after that one wait, on the general and the hot path,
    naming the lock, and is not run again (each retry would wait it out
    again: ten minutes at the 60 s default). Nothing is written."""
    monkeypatch.setattr(connections, "SQLITE_BUSY_TIMEOUT_MS", 300)
    url = f"sqlite:///{tmp_path / 'held.db'}"
    with Meter(url) as meter:
        meter.set_limit(Limit("calls", 10, "1h"))
        meter.consume("org", "calls", event_id="e1")
        holder = sqlite3.connect(tmp_path / "held.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        before = _busy_retries()
        with pytest.raises(DatabaseUnavailable, match="has held the SQLite database's write lock"):
            meter.set_limit(Limit("calls", 20, "1h"))
        with pytest.raises(DatabaseUnavailable, match="has held the SQLite database's write lock"):
            meter.consume("org", "calls", event_id="e2")
        assert _busy_retries() == before
        holder.rollback()
        holder.close()
        assert meter.get_limit("calls").maximum == 10
        assert meter.result("e2") is None
        assert meter.consume("org", "calls", event_id="e3").allowed
