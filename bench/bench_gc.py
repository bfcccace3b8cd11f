"""What the garbage collector costs a batch, and what a worker's `gc.freeze` saves.

    .venv/bin/python bench/bench_gc.py [--batches 20] [--cases plain priced mix]

On SQLite files, per `bench_mix` configuration, one process applies
1,000-event batches in turn as a library caller does (the collector as
Python leaves it, paused by the engine only while a batch is decided) and
as a worker does (everything built before the first
batch frozen, as `workers.app` does at ``worker_init``). Prints the median
CPU time per batch of each and their ratio: CPU time, so a busy machine
blurs the figures less than it would wall time.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time

from bench_mix import CASES, events_of, prepare

from metering import Meter


def measure(name: str, batches: int) -> tuple[float, float]:
    """(collector as left, frozen): median CPU ms per batch of case ``name``."""
    case = next(c for c in CASES if c.name == name)
    url = f"sqlite:///{tempfile.mkdtemp(prefix='metering-bench-gc-')}/m.db"
    subjects = [f"org-{n}" for n in range(500)]
    prepare(case, url, subjects)
    left: list[float] = []
    frozen: list[float] = []
    with Meter(url) as meter:
        work = [events_of(case, subjects, seed, 1000, meter) for seed in range(batches + 1)]
        meter.apply(work[0])
        for n, batch in enumerate(work[1:]):
            if n % 2:
                gc.freeze()
            start = time.process_time()
            meter.apply(batch)
            (frozen if n % 2 else left).append((time.process_time() - start) * 1000)
            gc.unfreeze()
    return statistics.median(left), statistics.median(frozen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--cases", nargs="+", default=["plain", "priced", "mix"])
    args = parser.parse_args()
    print("| configuration | CPU ms/batch | frozen | frozen / as left |")
    print("|---|---|---|---|")
    for name in args.cases:
        left, frozen = measure(name, args.batches)
        print(f"| {name} | {left:.1f} | {frozen:.1f} | {frozen / left:.2f} |")


if __name__ == "__main__":
    main()
