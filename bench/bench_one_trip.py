"""`Meter.consume` with the one-round-trip function on and off, against seed 001, same run.

    .venv/bin/python bench/bench_one_trip.py [--events 2000] [--rounds 2]

4 processes, 10,000 subjects, a calendar and a first-use window (the cases
of ``bench_consume.py``), on a durable PostgreSQL: seed 001's advisory-lock
function, then `Meter.consume` on the two-round-trip fast path (the
``one_trip`` path taken out of ``Engine.paths``) and with
``metering_consume_one``, in turn, each round. Prints events/s, p50/p99 and the ratio to the peer.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench_consume import LIMITS, prepare_database, ratio_row, subjects_for
from common import durable_postgres, print_table, run_parallel
from peers import advisory_window_job

from metering import Meter


def consume_job(url: str, limit: str, one_trip: bool) -> Any:
    def job(index: int, events: int) -> list[int]:
        meter = Meter(url)
        if not one_trip:
            engine = meter._engine
            engine.paths = [path for path in engine.paths if path.name != "one_trip"]
        meter.consume("warm-up", limit)
        latencies = []
        for subject in subjects_for(index + (100 if one_trip else 200), events):
            began = time.perf_counter_ns()
            meter.consume(subject, limit)
            latencies.append(time.perf_counter_ns() - began)
        meter.close()
        return latencies

    return job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="events per process")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows: list[list[str]] = []
    with durable_postgres() as server:
        url = prepare_database(server, LIMITS)
        for _ in range(args.rounds):
            peer = run_parallel(
                "peer: seed 001 advisory-lock window function",
                advisory_window_job(url, subjects_for),
                4,
                args.events,
            )
            rows.append([*peer.row(), "1.00"])
            for name, limit in (("calendar", "calls_cal"), ("first_use", "calls")):
                for one_trip in (False, True):
                    path = "one round trip" if one_trip else "two round trips"
                    figures = run_parallel(
                        f"Meter.consume, {name} window, {path}",
                        consume_job(url, limit, one_trip),
                        4,
                        args.events,
                    )
                    rows.append(ratio_row(figures, peer))
    print_table(
        "consume, 4 processes, one round trip against two",
        ["path", "processes", "events/s", "p50 ms", "p99 ms", "ratio to peer"],
        rows,
    )


if __name__ == "__main__":
    main()
