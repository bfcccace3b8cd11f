"""Voids on a ledger that spans months: a gauge's and a seat's against a sum's.

A sum's void takes its cost off its counter; a gauge's (its level again from
the window's reports) and a seat's (whether the value has another event in
the window) read the window's results. Fills ``results`` with ``--months``
months of ``--per-month`` events of a monthly sum over ``--subjects``
subjects, then, in the current hour, reports of an hourly gauge and events
of an hourly seat limit, and times in turn a void of each kind: the gauge's
and the seat's as a ratio to the sum's (the peer) in the same run. On
PostgreSQL the table is vacuumed first (the decided time's BRIN index
knows only the ranges a vacuum summarized), unless ``--no-vacuum``.

    .venv/bin/python bench/bench_voids.py --database sqlite
    .venv/bin/python bench/bench_voids.py --database postgresql
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import UTC, datetime

import psycopg
from common import durable_postgres, median, print_table

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.storage.connections import upgrade_schema

LIMITS = [
    Limit("calls", maximum=10**12, period="1mo", window="calendar"),
    Limit("disk", maximum=10**6, period="1h", window="calendar", aggregation="max"),
    Limit("users", maximum=10**6, period="1h", window="calendar", distinct="user"),
]
KINDS = {"sum": "calls", "gauge": "disk", "seat": "users"}


def fill(meter: Meter, clock: FrozenClock, args: argparse.Namespace) -> int:
    """``--months`` of a monthly sum's events, a batch of 1,000 at a time."""
    batches = args.per_month // 1000
    step_seconds = 30 * 86_400 // batches
    made = 0
    for _ in range(args.months * batches):
        events = [
            make_event(
                [(f"org-{random.randrange(args.subjects)}", "calls", 1)],
                clock(),
                event_id=f"old-{made + n}",
            )
            for n in range(1000)
        ]
        meter.apply(events)
        made += 1000
        clock.advance(seconds=step_seconds)
    return made


def voided(meter: Meter, kind: str, round_: int, voids: int) -> list[float]:
    """Milliseconds of each of ``voids`` voids of events of ``kind`` made now."""
    limit = KINDS[kind]
    ids = []
    for n in range(voids * 2):
        event_id = f"{kind}-{round_}-{n}"
        subject = f"org-{n % voids}"
        cost = random.randrange(1, 1000) if kind == "gauge" else 1
        metadata = {"user": f"u-{round_}-{n}"} if kind == "seat" else None
        meter.consume(subject, limit, cost, event_id=event_id, metadata=metadata)
        ids.append(event_id)
    times = []
    for event_id in ids[:voids]:
        started = time.perf_counter()
        meter.void(event_id, "bench")
        times.append((time.perf_counter() - started) * 1000)
    return times


def run(url: str, args: argparse.Namespace, database: str) -> list[list[str]]:
    clock = FrozenClock(datetime(2025, 11, 1, tzinfo=UTC))
    with Meter(url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        made = fill(meter, clock, args)
        if database == "PostgreSQL" and not args.no_vacuum:
            with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as connection:
                connection.execute("VACUUM ANALYZE results")
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for round_ in range(args.rounds):
            for kind in random.sample(list(KINDS), len(KINDS)):
                times[kind].extend(voided(meter, kind, round_, args.voids))
    peer = median(times["sum"])
    return [
        [
            database,
            f"{made:,}",
            kind,
            *(f"{v:.1f}" for v in (median(found), max(found))),
            f"{median(found) / peer:.1f}",
        ]
        for kind, found in times.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--months", type=int, default=12)
    parser.add_argument("--per-month", type=int, default=30_000)
    parser.add_argument("--subjects", type=int, default=200)
    parser.add_argument("--voids", type=int, default=10, help="a round and kind")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-vacuum", action="store_true", help="PostgreSQL: not vacuumed")
    args = parser.parse_args()
    if args.database == "sqlite":
        with tempfile.TemporaryDirectory() as scratch:
            rows = run(f"sqlite:///{scratch}/voids.db", args, "SQLite")
    else:
        with durable_postgres() as server:
            server.create_database("voids")
            url = server.url("voids")
            upgrade_schema(url)
            rows = run(url, args, "PostgreSQL")
    print_table(
        "a void's time by the kind of its limit, on a ledger of months",
        ["database", "results", "void of", "median ms", "max ms", "ratio to a sum's"],
        rows,
    )


if __name__ == "__main__":
    main()
