"""The overage report on a large ledger: time to a full CSV, and peak memory.

    .venv/bin/python bench/bench_report.py [--events 1000000 --subjects 100000] [--runs 3]
        [--sqlite]

Starts a throw-away PostgreSQL 15 and fills two databases with the counters
of a month of recorded events: a quarter of ``--events`` over a quarter of
``--subjects``, and all of them. The counters are loaded with one bulk
``INSERT ... SELECT`` that aggregates generated events per subject, limit
and window, because deciding a million events through ``consume`` would take
far longer than the report being measured. Two limits: ``api_calls`` (soft,
calendar month, 80% of the events) and ``exports`` (hard, calendar day).
A tenth of the ``api_calls`` subjects have an entitlement (half of them
upgraded mid-month) and a twentieth drew on a grant, so the report's
per-row lookups of the maximum that applied and of the grant-paid usage
find rows as well as miss them.

Then it runs, as a separate process each time,
``metering report overage --period 2026-11 --format csv > FILE`` and prints
the wall time (process start included) and the process's peak resident
memory (``ru_maxrss`` from ``wait4``). For contrast it also measures a
process that builds the whole report as a list (``overage_report``), which
grows with the data where the streamed CSV stays flat. With ``--sqlite`` the
same ledgers are copied (counters, entitlements) into a migrated SQLite file
and the CSV is timed there too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import ROOT, durable_postgres, print_table
from sqlalchemy import create_engine, text

from metering import Limit, Meter
from metering.domain.instants import to_us
from metering.storage.connections import upgrade_schema

MONTH_START_US = to_us(datetime(2026, 11, 1, tzinfo=UTC))
MONTH_END_US = to_us(datetime(2026, 12, 1, tzinfo=UTC))
DAY_US = 86_400 * 1_000_000
LIMITS = (
    Limit("api_calls", maximum=20, period="1mo", window="calendar", enforcement="soft"),
    Limit("exports", maximum=2, period="1d", window="calendar"),
)

# Events are generated in SQL, then folded into counters as `consume` would
# leave them: soft `api_calls` use everything; hard `exports` (cost 1, at most
# 2 a day) use up to the maximum and record the rest as denials.
FILL = """
WITH events AS (
    SELECT 'org-' || lpad(floor(random() * :subjects)::int::text, 6, '0') AS subject,
           CASE WHEN random() < 0.8 THEN 'api_calls' ELSE 'exports' END AS limit_name,
           :start + floor(random() * (:end - :start))::bigint AS at_us,
           1 + floor(random() * 4)::int AS cost
    FROM generate_series(1, :events)
), windows AS (
    SELECT subject, limit_name,
           CASE WHEN limit_name = 'api_calls' THEN :start
                ELSE at_us - (at_us - :start) % :day END AS window_start_us,
           count(*) AS n, sum(cost) AS total, min(at_us) AS first_at
    FROM events GROUP BY 1, 2, 3
)
INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, denied_count,
                      denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale, updated_at_us,
                      billing_month)
SELECT limit_name, subject, window_start_us,
       CASE WHEN limit_name = 'api_calls' THEN :end ELSE window_start_us + :day END,
       CASE WHEN limit_name = 'api_calls' THEN total ELSE least(n, 2) END,
       CASE WHEN limit_name = 'api_calls' THEN 0 ELSE greatest(n - 2, 0) END,
       CASE WHEN limit_name = 'api_calls' THEN 0 ELSE greatest(n - 2, 0) END,
       CASE WHEN limit_name = 'exports' AND n > 2 THEN first_at + 3600000000 END,
       NULL, 0, 1, :start, '2026-11'
FROM windows
"""

# Entitlements and grant draws for some api_calls subjects (see the docstring).
ALLOWANCES = (
    """
    INSERT INTO entitlements (subject, limit_name, effective_from_us, maximum, created_at_us)
    SELECT subject, limit_name, :start - :day, 30, :start FROM counters
    WHERE limit_name = 'api_calls' AND random() < 0.1
    """,
    """
    INSERT INTO entitlements (subject, limit_name, effective_from_us, maximum, created_at_us)
    SELECT subject, limit_name, :start + 11 * :day, 60, :start FROM entitlements
    WHERE random() < 0.5
    """,
    """
    UPDATE counters SET granted = least(used, 5)
    WHERE limit_name = 'api_calls' AND random() < 0.05
    """,
)

CSV_COMMAND = ["report", "overage", "--period", "2026-11", "--format", "csv", "--no-progress"]
LIST_SCRIPT = (
    "import sys; from metering import Meter; from metering.reports import overage_report; "
    "print(len(overage_report(Meter(sys.argv[1]), period='2026-11')))"
)


def fill(url: str, events: int, subjects: int) -> int:
    upgrade_schema(url)
    with Meter(url) as meter:
        meter.set_limits(LIMITS)
    engine = create_engine(url)
    params = {"subjects": subjects, "events": events, "day": DAY_US}
    params |= {"start": MONTH_START_US, "end": MONTH_END_US}
    with engine.begin() as connection:
        connection.execute(text("SELECT setseed(0.42)"))
        connection.execute(text(FILL), params)
        for statement in ALLOWANCES:
            connection.execute(text(statement), params)
        connection.execute(text("ANALYZE counters"))
        connection.execute(text("ANALYZE entitlements"))
        rows = connection.execute(text("SELECT count(*) FROM counters")).scalar_one()
    engine.dispose()
    return int(rows)


def copy_to_sqlite(url: str, path: Path) -> str:
    """A migrated SQLite file at ``path`` with ``url``'s limits, counters and entitlements."""
    target = f"sqlite:///{path}"
    upgrade_schema(target)
    with Meter(target) as meter:
        meter.set_limits(LIMITS)
    source, sink = create_engine(url), create_engine(target)
    with source.connect() as reading, sink.begin() as writing:
        for table in ("counters", "entitlements"):
            result = reading.execution_options(yield_per=50_000).execute(
                text(f"SELECT * FROM {table}")
            )
            for part in result.partitions():
                rows = [dict(row._mapping) for row in part]
                names = ", ".join(rows[0])
                marks = ", ".join(f":{name}" for name in rows[0])
                writing.execute(text(f"INSERT INTO {table} ({names}) VALUES ({marks})"), rows)
        writing.execute(text("ANALYZE"))
    source.dispose()
    sink.dispose()
    return target


def measure(command: list[str], output: Path) -> tuple[float, float]:
    """Run ``command`` with stdout to ``output``: (wall seconds, peak RSS in MiB)."""
    with output.open("wb") as out:
        began = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - began
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{command} failed with {process.returncode}")
    return seconds, usage.ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--subjects", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3, help="timed CSV runs per size (median)")
    parser.add_argument("--sqlite", action="store_true", help="time a SQLite copy too")
    args = parser.parse_args()
    sizes = [(args.events // 4, args.subjects // 4), (args.events, args.subjects)]
    table: list[list[str]] = []
    with durable_postgres() as server, tempfile.TemporaryDirectory() as scratch:
        for events, subjects in sizes:
            name = f"bench_{events}"
            server.create_database(name)
            url = server.url(name)
            began = time.perf_counter()
            counters = fill(url, events, subjects)
            print(
                f"filled {counters:,} counters from {events:,} events in "
                f"{time.perf_counter() - began:.1f} s",
                flush=True,
            )
            csv_file = Path(scratch) / f"{name}.csv"
            cli = [sys.executable, "-m", "metering", "--database", url, *CSV_COMMAND]
            runs = [measure(cli, csv_file) for _ in range(args.runs)]
            lines = sum(1 for _ in csv_file.open()) - 1
            listed = measure([sys.executable, "-c", LIST_SCRIPT, url], Path(scratch) / "n")
            table.append(
                [
                    f"{events:,} events, {subjects:,} subjects",
                    f"{lines:,}",
                    f"{statistics.median(s for s, _ in runs):.2f}",
                    f"{max(m for _, m in runs):.0f}",
                    f"{listed[1]:.0f}",
                ]
            )
            print(f"  {table[-1]}", flush=True)
            if args.sqlite:
                sqlite_url = copy_to_sqlite(url, Path(scratch) / f"{name}.db")
                cli = [sys.executable, "-m", "metering", "--database", sqlite_url, *CSV_COMMAND]
                runs = [measure(cli, csv_file) for _ in range(args.runs)]
                seconds = statistics.median(s for s, _ in runs)
                print(f"  SQLite: {seconds:.2f} s, {max(m for _, m in runs):.0f} MiB", flush=True)
    print_table(
        f"Full overage CSV on PostgreSQL (median of {args.runs} runs; process start included)",
        ["ledger", "CSV rows", "CSV seconds", "CSV peak RSS MiB", "as a list: peak RSS MiB"],
        table,
    )


if __name__ == "__main__":
    main()
