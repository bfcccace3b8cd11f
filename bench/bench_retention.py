"""Pruning `results` on PostgreSQL: chunked deletes against a partition drop.

Fills ``results`` with ``--rows`` results spread evenly over ``--days`` days
(the shape of a year of traffic), then times, on a durable server:

* the dry run (a count of what is old enough);
* an hourly prune in the steady state (an hour's worth of old rows);
* a catch-up prune of ``--catch-up-days`` days of old rows;

each without and with a BRIN index on ``decided_at_us``; and the peer, the
same rows in a table partitioned by day (declarative partitioning), pruned
by ``DROP TABLE`` of the old partitions.

    .venv/bin/python bench/bench_retention.py --rows 10000000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from common import durable_postgres
from sqlalchemy import Engine, create_engine, text

from metering import Meter
from metering.domain.instants import to_us
from metering.settings import RetentionPolicy
from metering.storage.connections import upgrade_schema
from metering.upkeep.retention import prune

DAY_US = 86_400 * 1_000_000
BRIN = "CREATE INDEX results_decided_brin ON results USING brin (decided_at_us)"
NOW = datetime(2026, 11, 23, tzinfo=UTC)

FILL = """
INSERT INTO {table} (event_id, outcome, fingerprint, occurred_at_us, decided_at_us,
                     denied_by, reason, charges, metadata)
SELECT 'evt-' || n, 'allowed', md5(n::text), :start + n * :step, :start + n * :step,
       NULL, NULL, '[["org-' || (n % 10000) || '","api_calls",1,"allowed",999,0]]', NULL
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n
"""


def timed(work: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = work()
    return time.perf_counter() - started, value


def fill(engine: Engine, table: str, rows: int, days: int) -> None:
    start = to_us(NOW) - days * DAY_US
    step = days * DAY_US // rows
    with engine.begin() as connection:
        for first in range(0, rows, 1_000_000):
            last = min(rows, first + 1_000_000) - 1
            params = {"start": start, "step": step, "first": first, "last": last}
            connection.execute(text(FILL.format(table=table)), params)
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").execute(
            text(f"VACUUM ANALYZE {table}")
        )


def prune_results(url: str, now: datetime, days: float, *, dry_run: bool) -> tuple[float, int]:
    class Clock:
        def __call__(self) -> datetime:
            return now

    with Meter(url, clock=Clock()) as meter:
        seconds, done = timed(
            lambda: prune(
                meter,
                RetentionPolicy(results_days=days, rejected_days=None, webhooks_days=None),
                visibility_timeout_seconds=300,
                dry_run=dry_run,
            )
        )
    [results] = [p for p in done if p.table == "results"]  # type: ignore[attr-defined]
    return seconds, results.rows


def partitioned(engine: Engine, rows: int, days: int, catch_up_days: int) -> list[list[str]]:
    start = to_us(NOW) - days * DAY_US
    with engine.begin() as connection:
        connection.execute(
            text(
                "CREATE TABLE results_by_day (LIKE results INCLUDING DEFAULTS) "
                "PARTITION BY RANGE (decided_at_us)"
            )
        )
        for day in range(days + 1):
            low, high = start + day * DAY_US, start + (day + 1) * DAY_US
            connection.execute(
                text(
                    f"CREATE TABLE results_day_{day} PARTITION OF results_by_day "
                    f"FOR VALUES FROM ({low}) TO ({high})"
                )
            )
    fill(engine, "results_by_day", rows, days)

    def drop(count: int, first: int) -> None:
        with engine.begin() as connection:
            for day in range(first, first + count):
                connection.execute(text(f"DROP TABLE results_day_{day}"))

    catch_up, _ = timed(lambda: drop(catch_up_days, 0))
    hourly, _ = timed(lambda: drop(1, catch_up_days))
    per_day = rows // days
    return [
        ["partition drop", "catch-up", str(catch_up_days * per_day), f"{catch_up:.2f}"],
        ["partition drop", "one day", str(per_day), f"{hourly:.3f}"],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=400)
    parser.add_argument("--catch-up-days", type=int, default=30)
    args = parser.parse_args()

    table: list[list[str]] = []
    keep = args.days - args.catch_up_days
    hour = timedelta(hours=1)
    with durable_postgres() as server:
        for index in ("no index", "BRIN"):
            name = "bench_brin" if index == "BRIN" else "bench_plain"
            server.create_database(name)
            url = server.url(name)
            upgrade_schema(url)
            engine = create_engine(url)
            started = time.perf_counter()
            fill(engine, "results", args.rows, args.days)
            seconds = time.perf_counter() - started
            print(f"{index}: filled {args.rows:,} results in {seconds:.0f} s", flush=True)
            if index == "BRIN":
                with engine.begin() as connection:
                    connection.execute(text(BRIN))
            # Catch-up: everything older than `keep` days; then an hour later,
            # the hour's worth that aged meanwhile (the beat's steady state).
            seconds, rows = prune_results(url, NOW, keep, dry_run=True)
            table.append([index, "dry run", str(rows), f"{seconds:.2f}"])
            seconds, rows = prune_results(url, NOW, keep, dry_run=False)
            table.append([index, "catch-up", str(rows), f"{seconds:.2f}"])
            seconds, rows = prune_results(url, NOW + hour, keep, dry_run=False)
            table.append([index, "hourly", str(rows), f"{seconds:.2f}"])
            if index == "no index":
                table += partitioned(engine, args.rows, args.days, args.catch_up_days)
            engine.dispose()
    print(f"\n{args.rows:,} results over {args.days} days, durable PostgreSQL 15")
    widths = [16, 10, 10, 10]
    header = ["method", "prune", "rows", "seconds"]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
