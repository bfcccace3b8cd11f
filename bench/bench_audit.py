"""What `metering audit` costs per 1,000 new results, on a large ledger.

Fills ``results`` with ``--rows`` allowed results of one calendar month
(``--subjects`` subjects, one unit each) and the counters they add up to,
on a durable PostgreSQL server (or a SQLite file, ``--sqlite``), then times:

* the first run (full: the whole ledger, and what it keeps per window);
* ``--rounds`` incremental runs, each after 1,000 new events applied
  through `Meter.apply` (a worker's batch) over ``--touched`` subjects:
  the cost that follows the traffic, not the history.

``--seats N``: the limit counts distinct ``user`` values, N per subject
(their rows, and new events of held values and one new value each).
``--dimensions``: the limit records a ``route`` of seven by dimension (its
rollup rows, which a full run checks: `rollup_ledger`).

    .venv/bin/python bench/bench_audit.py --rows 1000000
    .venv/bin/python bench/bench_audit.py --rows 1000000 --sqlite
    .venv/bin/python bench/bench_audit.py --rows 200000 --sqlite --seats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from common import durable_postgres, print_table
from sqlalchemy import Engine, create_engine, text

from metering import FrozenClock, Limit, Meter, make_event
from metering.domain.instants import to_us
from metering.storage.connections import upgrade_schema
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
MONTH = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 12, 1, tzinfo=UTC)
NEW = 1000

# One allowed unit of api_calls per result, as `ChargeDecision.to_row` writes it
# (with seats: 1 for a value's first event, 0 after, and the value in the metadata).
RESULTS = """
INSERT INTO results (event_id, outcome, fingerprint, occurred_at_us, decided_at_us,
                     denied_by, reason, charges, metadata)
SELECT 'old-' || n, 'allowed', 'fp', :start + n * :step, :start + n * :step, NULL, NULL,
       '[["org-' || (n % :subjects) || '","api_calls",' || {cost} || ',true,"allowed",1,'
       || '999999999,1000000000,0,' || :window || ',' || :end || ',null]]', {metadata}
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n
"""
SEAT_COST = "CASE WHEN n < CAST(:subjects AS bigint) * :users THEN 1 ELSE 0 END"
SEAT_METADATA = "'{\"user\":\"u' || ((n / :subjects) % :users) || '\"}'"
ROUTES = 7
ROUTE_METADATA = f"'{{\"route\":\"/r' || (n % {ROUTES}) || '\"}}'"
# The rollups of those results: per subject, hour and route, their count.
ROLLUPS = f"""
INSERT INTO usage_rollups (subject, limit_name, dimension, hour_start_us, value, used, events)
SELECT 'org-' || (n % :subjects), 'api_calls', 'route',
       (:start + n * :step) - ((:start + n * :step) % 3600000000), '/r' || (n % {ROUTES}),
       count(*), count(*)
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n
GROUP BY 1, 4, 5
"""
SEAT = """
INSERT INTO distinct_values (subject, limit_name, window_start_us, value, live_events)
VALUES (:subject, 'api_calls', :window, :value, 1)
"""
COUNTER = """
INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, denied_count,
                      denied_cost, tat_rem, tat_scale, updated_at_us, billing_month)
VALUES ('api_calls', :subject, :window, :end, :used, 0, 0, 0, 1, :now, '2026-11')
"""
SQLITE_SERIES = (
    "WITH RECURSIVE series(n) AS "
    "(SELECT {first} UNION ALL SELECT n + 1 FROM series WHERE n < {last}) "
)


def fill(
    engine: Engine, rows: int, subjects: int, *, sqlite: bool, users: int = 0, routes: bool = False
) -> None:
    start, window, end = to_us(MONTH), to_us(MONTH), to_us(END)
    step = (to_us(NOW - timedelta(hours=1)) - start) // rows
    common = {"start": start, "step": step, "subjects": subjects, "window": window, "end": end}
    common["users"] = users
    metadata = SEAT_METADATA if users else ROUTE_METADATA if routes else "NULL"
    results = RESULTS.format(cost=SEAT_COST if users else "1", metadata=metadata)
    with engine.begin() as connection:
        for first in range(0, rows, 500_000):
            last = min(rows, first + 500_000) - 1
            for statement in [results, ROLLUPS] if routes else [results]:
                if sqlite:
                    series = SQLITE_SERIES.format(first=first, last=last)
                    statement = series + statement.replace(
                        "generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n",
                        "series",
                    )
                connection.execute(text(statement), common | {"first": first, "last": last})
    per = [rows // subjects + (1 if s < rows % subjects else 0) for s in range(subjects)]
    counters = [
        {"subject": f"org-{s}", "used": min(n, users) if users else n}
        | {"window": window, "end": end, "now": to_us(NOW)}
        for s, n in enumerate(per[: min(subjects, rows)])
    ]
    seats = [
        {"subject": f"org-{s}", "window": window, "value": f"u{u}"}
        for s, n in enumerate(per)
        for u in range(min(n, users))
    ]
    with engine.begin() as connection:
        connection.execute(text(COUNTER), counters)
        if seats:
            connection.execute(text(SEAT), seats)
    with engine.connect() as connection:  # as autovacuum would have by then
        connection.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE" if sqlite else "VACUUM ANALYZE results")
        )


def timed_run(meter: Meter, **options: object) -> tuple[float, int]:
    started = time.perf_counter()
    report = run_audit(meter, **options)  # type: ignore[arg-type]
    seconds = time.perf_counter() - started
    assert report.ok, report.violations[:5]
    return seconds, report.windows


def measure(url: str, args: argparse.Namespace, label: str) -> list[list[str]]:
    upgrade_schema(url)
    engine = create_engine(url)
    started = time.perf_counter()
    sqlite = url.startswith("sqlite")
    fill(engine, args.rows, args.subjects, sqlite=sqlite, users=args.seats, routes=args.dimensions)
    print(f"{label}: filled {args.rows:,} results in {time.perf_counter() - started:.0f} s")
    engine.dispose()
    clock = FrozenClock(MONTH - timedelta(days=1))  # the limit defined before its results
    rows = []
    with Meter(url, clock=clock) as meter:
        distinct = "user" if args.seats else None
        meter.set_limit(
            Limit(
                "api_calls",
                maximum=1_000_000_000,
                period="1mo",
                window="calendar",
                distinct=distinct,
                dimensions=["route"] if args.dimensions else [],
            )
        )
        clock.set(NOW)
        full, windows = timed_run(meter, full=True)
        rows.append([label, "full (first run)", f"{args.rows:,}", str(windows), f"{full:.2f}"])
        seconds = []
        for round_number in range(args.rounds):
            clock.advance(minutes=2)
            events = [
                make_event(
                    [(f"org-{i % args.touched}", "api_calls", 1)],
                    clock(),
                    f"new-{round_number}-{i}",
                    metadata=(
                        {"user": f"u{i % (args.seats + 1)}"}
                        if args.seats
                        else {"route": f"/r{i % ROUTES}"}
                        if args.dimensions
                        else None
                    ),
                )
                for i in range(NEW)
            ]
            meter.apply(events)
            clock.advance(minutes=2)
            took, windows = timed_run(meter)
            seconds.append(took)
        per = statistics.median(seconds)
        rows.append(
            [
                label,
                f"incremental, median of {args.rounds}",
                f"{NEW:,} new",
                str(windows),
                f"{per:.3f}",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--touched", type=int, default=100, help="subjects the new events hit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file, not PostgreSQL")
    parser.add_argument("--seats", type=int, default=0, help="distinct users per subject")
    parser.add_argument("--dimensions", action="store_true", help="rollups by route")
    args = parser.parse_args()
    if args.seats and args.dimensions:
        parser.error("--seats or --dimensions, not both")
    if args.sqlite:
        with tempfile.TemporaryDirectory() as directory:
            table = measure(f"sqlite:///{Path(directory) / 'audit.db'}", args, "SQLite")
    else:
        with durable_postgres() as server:
            server.create_database("bench_audit")
            table = measure(server.url("bench_audit"), args, "PostgreSQL")
    print_table(
        "metering audit: seconds a run takes",
        ["database", "run", "results read", "windows", "seconds"],
        table,
    )


if __name__ == "__main__":
    main()
