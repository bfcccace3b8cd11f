"""Synchronous `consume` on PostgreSQL against a one-upsert-per-event baseline.

    .venv/bin/python bench/bench_consume.py [--events 2000]

Starts a durable PostgreSQL (fsync on), then for 1 and 4 processes and for a
hot subject and 10,000 subjects measures events/s and latency p50/p99 of

* ``consume``: one transaction per call (limit lookup, counter lock and
  update, results ledger), and
* the baseline: ``INSERT ... ON CONFLICT DO UPDATE SET count = count + 1``
  in its own transaction through the same driver, deciding nothing and
  recording nothing.
"""

from __future__ import annotations

import argparse
import random
import time

from common import Figures, durable_postgres, print_table, run_parallel
from servers import PostgresServer
from sqlalchemy import create_engine, text

from metering import Limit, Meter
from metering.storage.engine import upgrade_schema

BASELINE_DDL = """
CREATE TABLE IF NOT EXISTS baseline_counters (
    subject text PRIMARY KEY, count bigint NOT NULL DEFAULT 0
)"""
BASELINE_UPSERT = text(
    "INSERT INTO baseline_counters (subject, count) VALUES (:subject, 1) "
    "ON CONFLICT (subject) DO UPDATE SET count = baseline_counters.count + 1"
)


def subjects_for(spread: int, index: int, events: int) -> list[str]:
    rng = random.Random(index)
    return [f"subject-{rng.randrange(spread)}" for _ in range(events)]


def consume_job(url: str, limit: str, spread: int) -> object:
    def job(index: int, events: int) -> list[int]:
        meter = Meter(url)
        latencies = []
        for subject in subjects_for(spread, index, events):
            began = time.perf_counter_ns()
            meter.consume(subject, limit)
            latencies.append(time.perf_counter_ns() - began)
        meter.close()
        return latencies

    return job


def baseline_job(url: str, spread: int) -> object:
    def job(index: int, events: int) -> list[int]:
        engine = create_engine(url)
        latencies = []
        for subject in subjects_for(spread, index, events):
            began = time.perf_counter_ns()
            with engine.begin() as connection:
                connection.execute(BASELINE_UPSERT, {"subject": subject})
            latencies.append(time.perf_counter_ns() - began)
        engine.dispose()
        return latencies

    return job


def prepare_database(server: PostgresServer, limits: list[Limit]) -> str:
    """A migrated ``bench`` database with these limits and the baseline's table."""
    server.create_database("bench")
    url = server.url("bench")
    upgrade_schema(url)
    with Meter(url) as meter:
        meter.set_limits(limits)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text(BASELINE_DDL))
    engine.dispose()
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="events per process")
    args = parser.parse_args()
    with durable_postgres() as server:
        url = prepare_database(
            server,
            [
                Limit("calls", maximum=10**12, period="1d"),
                Limit("calls_cal", maximum=10**12, period="1d", window="calendar"),
            ],
        )
        results: list[Figures] = []
        for spread, label in ((1, "1 hot subject"), (10_000, "10,000 subjects")):
            for processes in (1, 4):
                cases = [
                    (f"consume, first_use window, {label}", consume_job(url, "calls", spread)),
                    (f"consume, calendar window, {label}", consume_job(url, "calls_cal", spread)),
                    (f"baseline upsert, {label}", baseline_job(url, spread)),
                ]
                for name, job in cases:
                    figures = run_parallel(name, job, processes, args.events)  # type: ignore[arg-type]
                    results.append(figures)
                    print(f"  {name:55} x{processes}: {figures.rate:8,.0f} events/s", flush=True)
    print_table(
        f"consume vs baseline on PostgreSQL (durable commits, {args.events} events per process)",
        ["load", "processes", "events/s", "p50 ms", "p99 ms"],
        [f.row() for f in results],
    )


if __name__ == "__main__":
    main()
