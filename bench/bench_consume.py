"""Synchronous `consume` against its peers, measured in the same run.

    .venv/bin/python bench/bench_consume.py [--events 2000]

PostgreSQL (durable: fsync and synchronous_commit on): `Meter.consume` on a
calendar window and on a first-use window, 10,000 subjects, 1 and 4
processes, against seed 001's advisory-lock window function on the same
server (`peers.advisory_window_job`); and 16 threads of one process sharing
a `Meter`, with group commit and without, against the function's 4
processes. SQLite: `Meter.consume` at the
documented default durability (WAL, ``synchronous=NORMAL``) against seed
000's upsert with triggers (`peers.sqlite_window_job`), one process.
Prints events/s, p50/p99 and the ratio to the peer.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import Figures, durable_postgres, print_table, run_parallel
from peers import advisory_window_job, install, sqlite_window_job
from servers import PostgresServer

from metering import Limit, Meter
from metering.storage.connections import upgrade_schema

SUBJECTS = 10_000
LIMITS = [
    Limit("calls", maximum=10**12, period="1d"),
    Limit("calls_cal", maximum=10**12, period="1d", window="calendar"),
]


def subjects_for(index: int, events: int) -> list[str]:
    rng = random.Random(index)
    return [f"subject-{rng.randrange(SUBJECTS)}" for _ in range(events)]


def consume_job(url: str, limit: str) -> Any:
    def job(index: int, events: int) -> list[int]:
        meter = Meter(url)
        meter.consume("warm-up", limit)
        latencies = []
        for subject in subjects_for(index, events):
            began = time.perf_counter_ns()
            meter.consume(subject, limit)
            latencies.append(time.perf_counter_ns() - began)
        meter.close()
        return latencies

    return job


def threaded_consume_job(url: str, limit: str, threads: int, group_commit: bool) -> Any:
    """One process, ``threads`` threads calling `consume` on one shared `Meter`."""

    def job(index: int, events: int) -> list[int]:
        meter = Meter(url, group_commit=group_commit, connections=2 * threads + 1)
        meter.consume("warm-up", limit)
        each = events // threads

        def caller(thread: int) -> list[int]:
            latencies = []
            for subject in subjects_for(index * 100 + thread, each):
                began = time.perf_counter_ns()
                meter.consume(subject, limit)
                latencies.append(time.perf_counter_ns() - began)
            return latencies

        with ThreadPoolExecutor(threads) as pool:
            found = [ns for part in pool.map(caller, range(threads)) for ns in part]
        meter.close()
        return found

    return job


def prepare_database(server: PostgresServer, limits: list[Limit]) -> str:
    """A migrated ``bench`` database with these limits and the peers' tables."""
    server.create_database("bench")
    url = server.url("bench")
    upgrade_schema(url)
    with Meter(url) as meter:
        meter.set_limits(limits)
    install(url)
    return url


def ratio_row(figures: Figures, peer: Figures) -> list[str]:
    return [*figures.row(), f"{figures.rate / peer.rate:.2f}"]


def sqlite_rows(events: int) -> list[list[str]]:
    """`Meter.consume` on SQLite and seed 000's upsert, one process each, in turn."""
    rows: list[list[str]] = []
    directory = Path(tempfile.mkdtemp(prefix="metering-bench-"))
    peer = run_parallel(
        "peer: seed 000 SQLite upsert + triggers (WAL, NORMAL)",
        sqlite_window_job(str(directory / "peer.db"), subjects_for),
        1,
        events,
    )
    rows.append([*peer.row(), "1.00"])
    with Meter(f"sqlite:///{directory}/metering.db") as meter:
        meter.set_limits(LIMITS)
    figures = run_parallel(
        "Meter.consume on SQLite, calendar window (default durability)",
        consume_job(f"sqlite:///{directory}/metering.db", "calls_cal"),
        1,
        events,
    )
    rows.append(ratio_row(figures, peer))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="events per process")
    parser.add_argument(
        "--sqlite-only", action="store_true", help="only the SQLite case (no PostgreSQL)"
    )
    args = parser.parse_args()
    rows: list[list[str]] = []
    if args.sqlite_only:
        rows.extend(sqlite_rows(args.events * 4))
        print_table(
            f"consume on SQLite against seed 000 ({SUBJECTS:,} subjects)",
            ["path", "processes", "events/s", "p50 ms", "p99 ms", "ratio to peer"],
            rows,
        )
        return
    with durable_postgres() as server:
        url = prepare_database(server, LIMITS)
        for processes in (1, 4):
            peer = run_parallel(
                "peer: seed 001 advisory-lock window function",
                advisory_window_job(url, subjects_for),
                processes,
                args.events,
            )
            rows.append([*peer.row(), "1.00"])
            for name, limit in (("calendar", "calls_cal"), ("first_use", "calls")):
                figures = run_parallel(
                    f"Meter.consume, {name} window", consume_job(url, limit), processes, args.events
                )
                rows.append(ratio_row(figures, peer))
                print(f"  {figures.name} x{processes}: {figures.rate:,.0f}/s", flush=True)
        # `peer` is now the advisory-lock function with 4 processes.
        for group_commit in (True, False):
            name = "group commit" if group_commit else "a transaction each"
            figures = run_parallel(
                f"Meter.consume, 16 threads in 1 process, {name} (ratio to peer x4)",
                threaded_consume_job(url, "calls_cal", 16, group_commit),
                1,
                args.events * 4,
            )
            rows.append(ratio_row(figures, peer))
            print(f"  {figures.name}: {figures.rate:,.0f}/s", flush=True)
    rows.extend(sqlite_rows(args.events * 4))
    print_table(
        f"consume against its peers ({SUBJECTS:,} subjects, {args.events} events per process)",
        ["path", "processes", "events/s", "p50 ms", "p99 ms", "ratio to peer"],
        rows,
    )


if __name__ == "__main__":
    main()
