"""`Meter.consume` on PostgreSQL with and without the speculative round trip, A/B.

    .venv/bin/python bench/bench_speculation.py [--calls 300] [--subjects 200] [CASE ...]

For each case of `bench_mix` (default: plain, priced, grant, seats), two
databases with the same set-up: one consumed by a meter that speculates on
cached rows (`metering.storage.hot.speculative`), one by a meter whose
fast path never does (``Direct.rows`` None). Calls interleave case by case
and A with B, on one durable PostgreSQL; each row prints the median latency
of both and their ratio, and how the speculation went (hits, misses,
checks that failed).
"""

from __future__ import annotations

import argparse
import random
import time

from bench_mix import CASES, prepare
from common import durable_postgres, median

from metering import Meter
from metering.engine.paths import Direct
from metering.storage.connections import upgrade_schema
from metering.storage.hot.speculative import SPECULATION


def direct_of(meter: Meter) -> Direct:
    path = meter._engine.path("direct")
    assert isinstance(path, Direct)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", default=["plain", "priced", "grant", "seats"])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--subjects", type=int, default=200)
    args = parser.parse_args()
    subjects = [f"subject-{n}" for n in range(args.subjects)]
    with durable_postgres() as server:
        server.create_database("template_ab")
        upgrade_schema(server.url("template_ab"))
        meters: dict[tuple[str, str], Meter] = {}
        cases = {case.name: case for case in CASES if case.name in args.cases}
        for name, case in cases.items():
            for variant in ("old", "new"):
                database = f"{name}_{variant}".replace(" ", "_")
                server.create_database(database, template="template_ab")
                prepare(case, server.url(database), subjects)
                meter = Meter(server.url(database))
                if variant == "old":
                    direct_of(meter).rows = None
                meters[(name, variant)] = meter
        rng = random.Random(0)
        latencies: dict[tuple[str, str], list[int]] = {key: [] for key in meters}
        stats: dict[str, dict[str, int]] = {name: {} for name in cases}
        for _ in range(args.calls):
            for name, case in cases.items():
                charges, metadata = case.call(rng.choice(subjects), rng)
                for variant in ("old", "new") if rng.random() < 0.5 else ("new", "old"):
                    meter = meters[(name, variant)]
                    before = SPECULATION.copy()
                    began = time.perf_counter_ns()
                    meter.consume(charges=charges, metadata=metadata)
                    latencies[(name, variant)].append(time.perf_counter_ns() - began)
                    for outcome, count in (SPECULATION - before).items():
                        stats[name][outcome] = stats[name].get(outcome, 0) + count
        print(f"{'case':<10} {'old p50 ms':>10} {'new p50 ms':>10} {'new/old':>8}  speculation")
        for name in cases:
            old = median(latencies[(name, "old")]) / 1e6
            new = median(latencies[(name, "new")]) / 1e6
            print(f"{name:<10} {old:>10.2f} {new:>10.2f} {new / old:>8.2f}  {stats[name]}")
        for meter in meters.values():
            meter.close()


if __name__ == "__main__":
    main()
