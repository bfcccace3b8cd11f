"""What the audit's index on ``results.decided_at_us`` costs the worker's path.

`Meter.apply` of 1,000-event batches with and without the index (BRIN on
PostgreSQL, a B-tree on SQLite), alternating every 15 batches for
``--rounds`` rounds so that the machine's drift hits both alike; prints the
median rate of each.

    .venv/bin/python bench/bench_audit_index.py
    .venv/bin/python bench/bench_audit_index.py --sqlite
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import durable_postgres
from sqlalchemy import text

from metering import FrozenClock, Limit, Meter, make_event
from metering.storage.connections import upgrade_schema

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)
BATCHES = 15
EVENTS = 1000


def measure(url: str, rounds: int, *, sqlite: bool) -> dict[str, float]:
    using = "" if sqlite else "USING brin "
    create = f"CREATE INDEX ix_results_decided_at_us ON results {using}(decided_at_us)"
    clock = FrozenClock(NOW)
    rates: dict[str, list[float]] = {"with the index": [], "without": []}
    with Meter(url, clock=clock) as meter:
        meter.set_limit(Limit("api_calls", maximum=10**12, period="1mo", window="calendar"))
        for number in range(rounds):
            kind = "with the index" if number % 2 == 0 else "without"
            with meter.database.engine.begin() as connection:
                connection.execute(text("DROP INDEX IF EXISTS ix_results_decided_at_us"))
                if kind == "with the index":
                    connection.execute(text(create))
            for batch in range(BATCHES):
                events = [
                    make_event(
                        [(f"org-{i % 2000}", "api_calls", 1)], clock(), f"{number}-{batch}-{i}"
                    )
                    for i in range(EVENTS)
                ]
                started = time.perf_counter()
                meter.apply(events)
                rates[kind].append(EVENTS / (time.perf_counter() - started))
                clock.advance(seconds=1)
    return {kind: statistics.median(values) for kind, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file, not PostgreSQL")
    args = parser.parse_args()
    if args.sqlite:
        with tempfile.TemporaryDirectory() as directory:
            found = measure(f"sqlite:///{Path(directory) / 'ab.db'}", args.rounds, sqlite=True)
    else:
        with durable_postgres() as server:
            server.create_database("bench_audit_index")
            url = server.url("bench_audit_index")
            upgrade_schema(url)
            found = measure(url, args.rounds, sqlite=False)
    for kind, rate in found.items():
        print(f"apply {kind}: {rate:,.0f} events/s (median of the batches)")


if __name__ == "__main__":
    main()
