"""`Meter.consume` on PostgreSQL with and without the speculative round trip, A/B.

    .venv/bin/python bench/bench_speculation.py [--calls 300] [--subjects 200]
                                                [--processes 1] [CASE ...]

For each case of `bench_mix` (default: plain, priced, grant, seats), two
databases with the same set-up: one consumed by a meter that speculates on
cached rows (`metering.storage.hot.speculative`), one by a meter whose
fast path never does (``Direct.rows`` None). Calls interleave case by case
and A with B, on one durable PostgreSQL; each row prints the median latency
of both and their ratio, how the speculation went (hits, misses, checks
that failed), and the median of the calls it speculated on and wrote.
With ``--processes N`` (N > 1), N forked processes share each case's
subjects, each meter first consuming once per subject
(its rows cached), and the rounds interleave A and B; what another process
wrote is stale in a meter's rows, which its speculation finds.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from bench_mix import CASES, Case, prepare
from common import durable_postgres, median, run_prepared

from metering import Meter
from metering.engine.paths import Direct
from metering.storage.connections import upgrade_schema
from metering.storage.hot.speculative import SPECULATION


def direct_of(meter: Meter) -> Direct:
    path = meter._engine.path("direct")
    assert isinstance(path, Direct)
    return path


def warm_job(url: str, case: Case, subjects: list[str], speculate: bool, seed: int) -> Any:
    """A `run_prepared` job: a meter that consumed once per subject, then timed calls."""

    def prepare(index: int, events: int) -> Callable[[], list[int]]:
        rng = random.Random(seed * 100 + index)
        meter = Meter(url)
        if not speculate:
            direct_of(meter).rows = None
        for subject in subjects:
            charges, metadata = case.call(subject, rng)
            meter.consume(charges=charges, metadata=metadata)
        work = [case.call(rng.choice(subjects), rng) for _ in range(events)]

        def timed() -> list[int]:
            latencies = []
            for charges, metadata in work:
                began = time.perf_counter_ns()
                meter.consume(charges=charges, metadata=metadata)
                latencies.append(time.perf_counter_ns() - began)
            if speculate and index == 0:
                print(f"  {case.name}, a process of the new: {dict(SPECULATION - before)}")
            return latencies

        before = SPECULATION.copy()
        return timed

    return prepare


def in_processes(
    urls: dict[tuple[str, str], str], cases: dict[str, Case], subjects: list[str], args: Any
) -> None:
    """Rounds of ``args.processes`` processes per case and variant, interleaved."""
    latencies: dict[tuple[str, str], list[int]] = {key: [] for key in urls}
    for round_ in range(args.rounds):
        for name, case in cases.items():
            order = ("old", "new") if round_ % 2 else ("new", "old")
            for variant in order:
                job = warm_job(urls[(name, variant)], case, subjects, variant == "new", round_)
                each = args.calls // args.processes
                figures = run_prepared(name, job, args.processes, each)
                latencies[(name, variant)].extend(figures.latencies_ns)
    print(f"{args.processes} processes, {args.rounds} rounds of {args.calls} calls")
    print(f"{'case':<10} {'old p50 ms':>10} {'new p50 ms':>10} {'new/old':>8}")
    for name in cases:
        old = median(latencies[(name, "old")]) / 1e6
        new = median(latencies[(name, "new")]) / 1e6
        print(f"{name:<10} {old:>10.2f} {new:>10.2f} {new / old:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", default=["plain", "priced", "grant", "seats"])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--subjects", type=int, default=200)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="with --processes")
    args = parser.parse_args()
    subjects = [f"subject-{n}" for n in range(args.subjects)]
    with durable_postgres() as server:
        server.create_database("template_ab")
        upgrade_schema(server.url("template_ab"))
        urls: dict[tuple[str, str], str] = {}
        cases = {case.name: case for case in CASES if case.name in args.cases}
        for name, case in cases.items():
            for variant in ("old", "new"):
                database = f"{name}_{variant}".replace(" ", "_")
                server.create_database(database, template="template_ab")
                prepare(case, server.url(database), subjects)
                urls[(name, variant)] = server.url(database)
        if args.processes > 1:
            in_processes(urls, cases, subjects, args)
            return
        meters: dict[tuple[str, str], Meter] = {}
        for (name, variant), url in urls.items():
            meter = Meter(url)
            if variant == "old":
                direct_of(meter).rows = None
            meters[(name, variant)] = meter
        rng = random.Random(0)
        latencies: dict[tuple[str, str], list[int]] = {key: [] for key in meters}
        stats: dict[str, dict[str, int]] = {name: {} for name in cases}
        hits: dict[str, list[int]] = {name: [] for name in cases}  # new's speculations written
        for _ in range(args.calls):
            for name, case in cases.items():
                charges, metadata = case.call(rng.choice(subjects), rng)
                for variant in ("old", "new") if rng.random() < 0.5 else ("new", "old"):
                    meter = meters[(name, variant)]
                    before = SPECULATION.copy()
                    began = time.perf_counter_ns()
                    meter.consume(charges=charges, metadata=metadata)
                    took = time.perf_counter_ns() - began
                    latencies[(name, variant)].append(took)
                    done = SPECULATION - before
                    for outcome, count in done.items():
                        stats[name][outcome] = stats[name].get(outcome, 0) + count
                    if done["hit"]:
                        hits[name].append(took)
        header = f"{'case':<10} {'old p50 ms':>10} {'new p50 ms':>10} {'new/old':>8}"
        print(f"{header} {'hits p50':>8}  speculation")
        for name in cases:
            old = median(latencies[(name, "old")]) / 1e6
            new = median(latencies[(name, "new")]) / 1e6
            hit = f"{median(hits[name]) / 1e6:.2f}" if hits[name] else "-"
            print(f"{name:<10} {old:>10.2f} {new:>10.2f} {new / old:>8.2f} {hit:>8}  {stats[name]}")
        for meter in meters.values():
            meter.close()


if __name__ == "__main__":
    main()
