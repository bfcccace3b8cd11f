"""Reserve then settle on SQLite, per round trip: thread CPU and wall, by kind of settle.

    .venv/bin/python bench/bench_commit_priced.py [--trips 1000] [--rounds 2]

Kinds: ``plain`` (an unpriced reservation of 4 committed at 1: the direct path),
``priced`` (4 units at a cent, committed at 4: in full, the direct path),
``cancel`` (priced, cancelled: money goes back under SQLAlchemy) and ``partial``
(priced, committed at 1: its money follows its units, under SQLAlchemy). Run it
under ``PYTHONPATH=<a worktree>`` to compare commits; rounds interleave the kinds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import print_table

from metering import Limit, Meter, spend_limit

KINDS = ("plain", "priced", "cancel", "partial")


def trips(kind: str, count: int) -> tuple[float, float]:
    """Microseconds of thread CPU and wall per reserve and settle of ``kind``."""
    with (
        tempfile.TemporaryDirectory() as directory,
        Meter(f"sqlite:///{Path(directory) / 'bench.db'}") as meter,
    ):
        meter.set_limits(
            [
                Limit("calls", maximum=10**9, period="1d", window="calendar"),
                spend_limit("usd", "1000000", "USD", "1d", window="calendar"),
            ]
        )
        if kind != "plain":
            meter.set_price("calls", "0.01", "USD")
        actual = 4 if kind == "priced" else 1

        def one(index: int) -> None:
            held = meter.reserve(f"s{index % 50}", "calls", cost=4)
            if kind == "cancel":
                held.cancel()
            else:
                held.commit(actual=actual)

        for index in range(50):  # warm: the limits' cache, the statements
            one(index)
        cpu, wall = time.thread_time(), time.perf_counter()
        for index in range(count):
            one(index)
        return (
            1e6 * (time.thread_time() - cpu) / count,
            1e6 * (time.perf_counter() - wall) / count,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for round_ in range(args.rounds):
        for kind in KINDS:
            cpu, wall = trips(kind, args.trips)
            rows.append([str(round_ + 1), kind, f"{cpu:,.0f}", f"{wall:,.0f}"])
    print_table(
        "Reserve and settle, SQLite", ["round", "settle", "CPU µs/trip", "wall µs/trip"], rows
    )


if __name__ == "__main__":
    main()
