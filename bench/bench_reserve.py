"""Reserve + cancel round trips on PostgreSQL, against consume and the baseline.

    .venv/bin/python bench/bench_reserve.py [--events 1000]

Starts a durable PostgreSQL (fsync on). For 1 and 4 processes over 10,000
subjects it measures, per operation, events/s and latency p50/p99 of

* ``reserve + cancel``: the whole round trip of a valid login (two
  transactions: reserve decides, records and keeps a row; cancel locks the
  row and the counter and gives the cost back);
* ``reserve`` and ``cancel`` alone (from the same runs);
* ``reserve + commit``: a failed login's round trip;
* ``consume``, and the baseline: one upsert per event in its own transaction.
"""

from __future__ import annotations

import argparse
import random
import time

from bench_consume import consume_job, prepare_database, subjects_for
from common import Figures, durable_postgres, print_table, run_parallel
from peers import advisory_window_job

from metering import Limit, Meter


def _subjects(index: int, events: int) -> list[str]:
    rng = random.Random(index)
    return [f"10.0.{rng.randrange(40)}.{rng.randrange(250)}" for _ in range(events)]


def round_trip_job(url: str, settle: str, part: str) -> object:
    """Latencies of reserve then cancel/commit: the whole trip, or one ``part``."""

    def job(index: int, events: int) -> list[int]:
        meter = Meter(url)
        latencies = []
        for subject in _subjects(index, events):
            began = time.perf_counter_ns()
            reservation = meter.reserve(subject, "bad_login")
            reserved = time.perf_counter_ns()
            reservation.cancel() if settle == "cancel" else reservation.commit()
            done = time.perf_counter_ns()
            trip = {"trip": done - began, "reserve": reserved - began, "settle": done - reserved}
            latencies.append(trip[part])
        meter.close()
        return latencies

    return job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000, help="round trips per process")
    args = parser.parse_args()
    with durable_postgres() as server:
        url = prepare_database(server, [Limit("bad_login", maximum=10**12, period="1h")])
        results: list[Figures] = []
        for processes in (1, 4):
            cases = [
                ("reserve + cancel (round trip)", round_trip_job(url, "cancel", "trip")),
                ("  reserve alone", round_trip_job(url, "cancel", "reserve")),
                ("  cancel alone", round_trip_job(url, "cancel", "settle")),
                ("reserve + commit (round trip)", round_trip_job(url, "commit", "trip")),
                ("consume", consume_job(url, "bad_login")),
                ("peer: advisory-lock window", advisory_window_job(url, subjects_for)),
            ]
            for name, job in cases:
                figures = run_parallel(name, job, processes, args.events)  # type: ignore[arg-type]
                results.append(figures)
                print(f"  {name:32} x{processes}: {figures.rate:8,.0f} /s", flush=True)
    print_table(
        f"reservations on PostgreSQL (durable commits, {args.events} per process, 10,000 subjects)",
        ["operation", "processes", "per second", "p50 ms", "p99 ms"],
        [f.row() for f in results],
    )


if __name__ == "__main__":
    main()
