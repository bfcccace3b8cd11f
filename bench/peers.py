"""The peers each benchmark is measured against, in the same run, on the same server.

Written here from the designs the product grew from (``../shared/seeds/``):

* `aggregate_upsert`: the ceiling for applying usage events in SQL: one
  ``unnest`` + ``GROUP BY`` upsert per 1,000-event batch, in autocommit;
  it decides nothing and records no results.
* `advisory_window_job`: seed 001's fixed window: a PL/pgSQL function that
  takes ``pg_advisory_xact_lock`` on the key and upserts its counter, one
  call per transaction (the boolean form, which answers instead of raising).
* `sqlite_window_job`: seed 000's fixed window on SQLite: one upsert per
  call with two triggers (expire, stamp the maximum), WAL,
  ``synchronous=NORMAL``, autocommit.
* `ledger_postgres`, `ledger_sqlite`: the bare work an applied batch must
  do, with no decision: insert its results rows (the event id the primary
  key) and upsert the aggregate counters, one transaction per 1,000-event
  batch, through the driver the engine's hot path uses (psycopg, stdlib
  ``sqlite3`` in WAL with ``synchronous=NORMAL``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import psycopg

PEER_DDL = """
CREATE TABLE IF NOT EXISTS peer_counters (
    subject text NOT NULL, limit_name text NOT NULL, window_start bigint NOT NULL,
    used bigint NOT NULL, PRIMARY KEY (subject, limit_name, window_start)
);
CREATE TABLE IF NOT EXISTS peer_windows (
    key text PRIMARY KEY, count integer NOT NULL, window_start timestamptz NOT NULL
);
CREATE OR REPLACE FUNCTION peer_window(rate_key text, max_requests int, window_seconds int)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    counted int;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(rate_key));
    INSERT INTO peer_windows AS w (key, count, window_start) VALUES (rate_key, 1, now())
    ON CONFLICT (key) DO UPDATE SET
        count = CASE WHEN w.window_start < now() - make_interval(secs => window_seconds)
                     THEN 1 ELSE w.count + 1 END,
        window_start = CASE WHEN w.window_start < now() - make_interval(secs => window_seconds)
                            THEN now() ELSE w.window_start END
    RETURNING count INTO counted;
    RETURN counted <= max_requests;
END;
$$;
"""

AGGREGATE_UPSERT = """
INSERT INTO peer_counters (subject, limit_name, window_start, used)
SELECT s, l, %s, sum(n) FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS e(s, l, n)
GROUP BY s, l
ON CONFLICT (subject, limit_name, window_start)
DO UPDATE SET used = peer_counters.used + excluded.used
"""


def dsn(url: str) -> str:
    """A libpq connection string from a SQLAlchemy URL."""
    return url.replace("postgresql+psycopg://", "postgresql://")


def install(url: str) -> None:
    with psycopg.connect(dsn(url), autocommit=True) as connection:
        connection.execute(PEER_DDL)


def aggregate_upsert(url: str, batches: Sequence[Sequence[tuple[str, str, int]]]) -> float:
    """Events/s of the aggregate upsert over ``batches`` of (subject, limit, cost)."""
    with psycopg.connect(dsn(url), autocommit=True) as connection:
        cursor = connection.cursor()
        window = 0
        began = time.perf_counter()
        for batch in batches:
            subjects, limits, costs = (list(column) for column in zip(*batch, strict=True))
            cursor.execute(AGGREGATE_UPSERT, (window, subjects, limits, costs), prepare=True)
        seconds = time.perf_counter() - began
    return sum(len(b) for b in batches) / seconds


def advisory_window_job(url: str, keys: Any) -> Any:
    """A `run_parallel` job: ``keys(index, events)`` calls of seed 001's function."""

    def job(index: int, events: int) -> list[int]:
        latencies = []
        with psycopg.connect(dsn(url), autocommit=True) as connection:
            cursor = connection.cursor()
            for key in keys(index, events):
                began = time.perf_counter_ns()
                cursor.execute("SELECT peer_window(%s, 1000000000, 86400)", (key,), prepare=True)
                cursor.fetchone()
                latencies.append(time.perf_counter_ns() - began)
        return latencies

    return job


SQLITE_PEER_SCHEMA = """
CREATE TABLE limits (id INTEGER PRIMARY KEY, maximum INTEGER NOT NULL,
                     period_minutes INTEGER NOT NULL);
CREATE TABLE visitor_limits (
    visitor TEXT NOT NULL, limit_id INTEGER NOT NULL, count INTEGER NOT NULL DEFAULT 1,
    maximum INTEGER, expires_at INTEGER,
    denied INTEGER GENERATED ALWAYS AS (coalesce(count > maximum, 0)) VIRTUAL,
    PRIMARY KEY (visitor, limit_id)
) WITHOUT ROWID;
CREATE TRIGGER expire BEFORE INSERT ON visitor_limits BEGIN
    DELETE FROM visitor_limits WHERE visitor = NEW.visitor AND limit_id = NEW.limit_id
                                 AND expires_at <= unixepoch();
END;
CREATE TRIGGER stamp AFTER INSERT ON visitor_limits BEGIN
    UPDATE visitor_limits SET maximum = l.maximum, expires_at = unixepoch() + 60 * l.period_minutes
    FROM limits AS l WHERE l.id = NEW.limit_id
      AND visitor_limits.visitor = NEW.visitor AND visitor_limits.limit_id = NEW.limit_id;
END;
INSERT INTO limits VALUES (1, 1000000000, 1440);
"""
SQLITE_PEER_UPSERT = (
    "INSERT INTO visitor_limits (visitor, limit_id) VALUES (?, 1) "
    "ON CONFLICT DO UPDATE SET count = count + 1 RETURNING denied, expires_at"
)


def sqlite_window_job(path: str, keys: Any) -> Any:
    """A `run_parallel` job: seed 000's upsert on a fresh SQLite file."""

    def job(index: int, events: int) -> list[int]:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.executescript(SQLITE_PEER_SCHEMA)
        latencies = []
        for key in keys(index, events):
            began = time.perf_counter_ns()
            connection.execute(SQLITE_PEER_UPSERT, (key,)).fetchall()
            latencies.append(time.perf_counter_ns() - began)
        connection.close()
        return latencies

    return job


LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ledger_results (
    event_id text PRIMARY KEY, subject text NOT NULL, limit_name text NOT NULL,
    cost bigint NOT NULL, occurred_us bigint NOT NULL, outcome text NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger_counters (
    subject text NOT NULL, limit_name text NOT NULL, window_start bigint NOT NULL,
    used bigint NOT NULL, PRIMARY KEY (subject, limit_name, window_start)
);
"""
LEDGER_RESULTS_PG = """
INSERT INTO ledger_results
SELECT e, s, l, n, t, 'allowed'
FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[]) AS x(e, s, l, n, t)
"""
LEDGER_COUNTERS_PG = """
INSERT INTO ledger_counters (subject, limit_name, window_start, used)
SELECT s, l, 0, sum(n) FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS x(s, l, n)
GROUP BY s, l
ON CONFLICT (subject, limit_name, window_start)
DO UPDATE SET used = ledger_counters.used + excluded.used
"""
LEDGER_RESULTS_SQLITE = "INSERT INTO ledger_results VALUES (?, ?, ?, ?, ?, 'allowed')"
LEDGER_COUNTERS_SQLITE = (
    "INSERT INTO ledger_counters VALUES (?, ?, 0, ?) ON CONFLICT DO UPDATE SET used = used + ?"
)
LedgerRow = tuple[str, str, str, int, int]  # event id, subject, limit, cost, occurred_at (us)


def _sqlite_ledger(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    return connection


def install_ledger(target: str) -> None:
    """The ledger peer's tables: ``target`` a PostgreSQL URL or a SQLite path."""
    if target.startswith("postgresql"):
        with psycopg.connect(dsn(target), autocommit=True) as connection:
            connection.execute(LEDGER_DDL)
        return
    connection = _sqlite_ledger(target)
    connection.executescript(LEDGER_DDL)
    connection.close()


def ledger_postgres(url: str, batches: Sequence[Sequence[LedgerRow]]) -> tuple[float, list[int]]:
    """(seconds, ns per batch): each batch's results rows and counters in one transaction."""
    latencies = []
    with psycopg.connect(dsn(url)) as connection:
        cursor = connection.cursor()
        began = time.perf_counter()
        for batch in batches:
            start = time.perf_counter_ns()
            ids, subjects, limits, costs, times = (list(c) for c in zip(*batch, strict=True))
            cursor.execute(LEDGER_RESULTS_PG, (ids, subjects, limits, costs, times), prepare=True)
            cursor.execute(LEDGER_COUNTERS_PG, (subjects, limits, costs), prepare=True)
            connection.commit()
            latencies.append(time.perf_counter_ns() - start)
        seconds = time.perf_counter() - began
    return seconds, latencies


def ledger_sqlite(path: str, batches: Sequence[Sequence[LedgerRow]]) -> tuple[float, list[int]]:
    """`ledger_postgres` on SQLite: ``executemany`` of both, summed per counter first."""
    connection = _sqlite_ledger(path)
    latencies = []
    began = time.perf_counter()
    for batch in batches:
        start = time.perf_counter_ns()
        used: dict[tuple[str, str], int] = {}
        for _id, subject, limit, cost, _at in batch:
            used[(subject, limit)] = used.get((subject, limit), 0) + cost
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany(LEDGER_RESULTS_SQLITE, batch)
        connection.executemany(LEDGER_COUNTERS_SQLITE, [(*k, n, n) for k, n in used.items()])
        connection.execute("COMMIT")
        latencies.append(time.perf_counter_ns() - start)
    seconds = time.perf_counter() - began
    connection.close()
    return seconds, latencies
