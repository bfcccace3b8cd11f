"""How soon a lowered entitlement reaches every process's leases, on PostgreSQL.

    .venv/bin/python bench/bench_lease_notice.py [--processes 3] [--trials 20]

Each trial: ``--processes`` processes (each its own `Meter` and lease book,
on the system clock) call `Meter.lease` on one subject of a hard limit of
1,000,000 in a loop, so each holds leases; 1 s after each is served from
a lease, the parent sets the
subject's entitlement to 50 (far below what was used). Printed: the delay
from the commit (the return of `set_entitlement`) to each process's book
applying the notice, median and worst over every process and trial, and the
requests allowed from leases after the commit, in all.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from typing import Any

from common import durable_postgres, print_table

from metering import Limit, Meter
from metering.storage.connections import upgrade_schema

LIMIT = "hard"
HAMMER_SECONDS = 1.0
AFTER_SECONDS = 0.5


def hammer(url: str, subject: str, committed: Any, ready: Any, out: Any) -> None:
    """Lease until the parent's commit plus `AFTER_SECONDS`; report when the
    book applied the notice and the lease decisions allowed after the commit."""
    with Meter(url) as meter:
        book = meter.leases
        seen: list[float] = []
        applied = book.changed

        def changed(s: str | None, limit: str | None) -> None:
            applied(s, limit)
            if s in (None, subject):
                seen.append(time.time())

        book.changed = changed  # type: ignore[method-assign]
        stamps: list[float] = []
        began = time.time()
        while committed.value == 0.0 or time.time() < committed.value + AFTER_SECONDS:
            decision = meter.lease(subject, LIMIT)
            if decision.allowed and decision.event_id.startswith("lease-"):
                if not stamps:
                    ready.put(True)
                stamps.append(time.time())
            if time.time() - began > 30:
                break
        after = sum(1 for stamp in stamps if stamp > committed.value)
        out.put((min(seen) - committed.value if seen else None, after, len(stamps)))


def trial(url: str, processes: int, index: int) -> list[tuple[float | None, int, int]]:
    context = multiprocessing.get_context("spawn")
    committed, ready, out = context.Value("d", 0.0), context.Queue(), context.Queue()
    subject = f"org-{index}"
    procs = [
        context.Process(target=hammer, args=(url, subject, committed, ready, out))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)  # each holds a lease
    time.sleep(HAMMER_SECONDS)
    with Meter(url) as meter:
        meter.set_entitlement(subject, LIMIT, 50)
        committed.value = time.time()
    reports = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(60)
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    with durable_postgres() as server:
        server.create_database("bench")
        url = server.url("bench")
        upgrade_schema(url)
        with Meter(url) as meter:
            meter.set_limit(Limit(LIMIT, maximum=1_000_000, period="1d", window="calendar"))
        reports = [r for n in range(args.trials) for r in trial(url, args.processes, n)]
    delays = sorted(d for d, _after, _leased in reports if d is not None)
    missed = sum(1 for d, _after, _leased in reports if d is None)
    after = sum(a for _d, a, _leased in reports)
    leased = sum(n for _d, _a, n in reports)
    print_table(
        f"{args.processes} processes x {args.trials} trials: commit -> notice applied",
        ["median ms", "worst ms", "notices missed", "allowed from leases after", "from leases"],
        [
            [
                f"{1000 * delays[len(delays) // 2]:.1f}",
                f"{1000 * delays[-1]:.1f}",
                str(missed),
                str(after),
                str(leased),
            ]
        ],
    )


if __name__ == "__main__":
    main()
