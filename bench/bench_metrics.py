"""What counting metrics costs the hot path, counting on and off in the same run.

    .venv/bin/python bench/bench_metrics.py [--rounds 7] [--batches 20] [--consumes 2000]

One process, the embedded default (SQLite, WAL, ``synchronous=NORMAL``: the
fastest decisions metering makes, so the largest share counting can take):

* ``apply_batch`` of 1,000-event batches (the worker's task body), and
* ``Meter.consume`` one event at a time (group commit off),

each with counting as shipped ("on") and with `Meter`'s count and
``apply_batch``'s timing replaced by no-ops ("off"), in alternating order,
``--rounds`` times, each batch and each block of 50 calls timed alone; the
table gives the best time of each (the least disturbed by the rest of the
machine) and on/off. Then the same in
prometheus-client's multiprocess mode (what a worker with
``METERING_METRICS_PORT`` runs: every increment a write to a memory-mapped
file), the counting of one 1,000-event batch alone, and one call of
`metering.telemetry.metrics.count_events` (what a single ``consume`` adds).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import ROOT, print_table

import metering.pipeline.batches
from metering import Limit, Meter, make_event, meter
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.telemetry.metrics import count_events, enable_multiprocess

LIMITS = [
    Limit("bench_calls", maximum=10**12, period="1d", window="calendar"),
    Limit("bench_seats", maximum=10**12, period="1d"),
]
BATCH = 1000


@contextmanager
def counting_off() -> Iterator[None]:
    saved = meter._count, metering.pipeline.batches.observe_batch
    meter._count = lambda *args: None  # type: ignore[assignment]
    metering.pipeline.batches.observe_batch = lambda *args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        meter._count, metering.pipeline.batches.observe_batch = saved  # type: ignore[assignment]


def batches(tag: str, count: int) -> list[dict[str, Any]]:
    at = datetime.now(UTC)
    return [
        encode_batch(
            [
                encode_event(
                    make_event([(f"s-{n % 500}", LIMITS[n % 2].name, 1)], at, f"{tag}-{b}-{n}")
                )
                for n in range(BATCH)
            ]
        )
        for b in range(count)
    ]


def time_batches(m: Meter, payloads: list[dict[str, Any]]) -> float:
    began = time.perf_counter()
    for payload in payloads:
        apply_batch(m, payload)
    return (time.perf_counter() - began) / len(payloads)


def time_consumes(m: Meter, tag: str, count: int) -> float:
    began = time.perf_counter()
    for n in range(count):
        m.consume(f"c-{n % 500}", "bench_calls", event_id=f"consume-{tag}-{n}")
    return (time.perf_counter() - began) / count


def measure(rounds: int, batch_count: int, consumes: int, workdir: Path) -> dict[str, list[float]]:
    """Per round, for each mode in alternating order: ``batch_count`` batches
    one at a time and ``consumes`` calls in blocks of 50, each timed alone."""
    url = f"sqlite:///{workdir / 'bench.db'}"
    found: dict[str, list[float]] = {}
    with Meter(url) as m, Meter(url, group_commit=False) as single:
        m.set_limits(LIMITS)
        time_batches(m, batches("warm", 2))
        time_consumes(single, "warm", 200)
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            payloads = {mode: batches(f"{mode}{r}", batch_count) for mode in order}
            for b in range(batch_count):
                for mode in order:
                    with counting_off() if mode == "off" else _nothing():
                        seconds = time_batches(m, [payloads[mode][b]])
                    found.setdefault(f"batch {mode}", []).append(seconds)
            for block in range(consumes // 50):
                for mode in order:
                    with counting_off() if mode == "off" else _nothing():
                        seconds = time_consumes(single, f"{mode}{r}-{block}", 50)
                    found.setdefault(f"consume {mode}", []).append(seconds)
    return found


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def count_alone(repeats: int = 200) -> float:
    """Seconds `Meter`'s count takes for one 1,000-event batch (answers as
    applied), the best of blocks of ten."""
    from metering.engine.fast import NEW
    from metering.storage.results import ResultRecord

    events = [
        make_event([(f"s-{n}", LIMITS[n % 2].name, 1)], datetime.now(UTC)).record()
        for n in range(BATCH)
    ]
    answers = [
        (NEW, ResultRecord(e.event_id, "allowed", "", 0, 0, (), None, [], None)) for e in events
    ]
    known = {limit.name for limit in LIMITS}
    best = float("inf")
    for _ in range(repeats // 10):
        began = time.perf_counter()
        for _ in range(10):
            meter._count(events, answers, known, "reject", 0)
        best = min(best, (time.perf_counter() - began) / 10)
    return best


def count_events_alone(repeats: int = 100_000) -> float:
    """Seconds one `count_events` call of a single decision takes, the best of
    blocks of a thousand."""
    figures = ({("bench_calls", "allowed"): 1}, {}, {}, 0)
    best = float("inf")
    for _ in range(repeats // 1000):
        began = time.perf_counter()
        for _ in range(1000):
            count_events(*figures)
        best = min(best, (time.perf_counter() - began) / 1000)
    return best


def child(args: argparse.Namespace) -> None:
    """One measurement in this process, printed as ``name value`` lines."""
    workdir = Path(tempfile.mkdtemp(prefix="metering-bench-metrics-"))
    if args.multiprocess:
        enable_multiprocess(workdir / "metrics")
    for name, values in measure(args.rounds, args.batches, args.consumes, workdir).items():
        print(name, min(values))
    print("count-alone", count_alone())
    print("count-events", count_events_alone())


def run(mode: list[str], args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", *mode]
    command += ["--rounds", str(args.rounds), "--batches", str(args.batches)]
    command += ["--consumes", str(args.consumes)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    figures: dict[str, float] = {}
    for line in done.stdout.splitlines():
        name, _, value = line.rpartition(" ")
        figures[name] = float(value)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=5, help="1,000-event batches per round")
    parser.add_argument("--consumes", type=int, default=500, help="consume calls per round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--multiprocess", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows: list[list[str]] = []
    for label, mode in (("one process", []), ("multiprocess files", ["--multiprocess"])):
        figures = run(mode, args)

        def ratio(what: str, figures: dict[str, float] = figures) -> str:
            return f"{figures[what + ' on'] / figures[what + ' off']:.3f}"

        rows.append(
            [
                f"apply_batch, 1,000 events ({label})",
                f"{figures['batch off'] * 1e3:.2f} ms",
                f"{figures['batch on'] * 1e3:.2f} ms",
                ratio("batch"),
            ]
        )
        rows.append(
            [
                f"Meter.consume ({label})",
                f"{figures['consume off'] * 1e6:.0f} µs",
                f"{figures['consume on'] * 1e6:.0f} µs",
                ratio("consume"),
            ]
        )
        rows.append(
            [
                f"counting one 1,000-event batch alone ({label})",
                "",
                f"{figures['count-alone'] * 1e6:.0f} µs",
                "",
            ]
        )
        rows.append(
            [
                f"count_events of one decision ({label})",
                "",
                f"{figures['count-events'] * 1e6:.1f} µs",
                "",
            ]
        )
        print(f"  {label}: {figures}", flush=True)
    print_table(
        f"metrics on the hot path (SQLite, best of {args.rounds} rounds, on/off alternating)",
        ["path", "counting off", "counting on", "on / off"],
        rows,
    )


if __name__ == "__main__":
    main()
