"""`Meter.check` on SQLite: milliseconds per check, by configuration.

    .venv/bin/python bench/bench_check.py [--checks 2000] [--rounds 3]

One process, a SQLite file at the default durability, 100 subjects each
with some usage. Configurations: a plain hard limit; the same priced, with
a spend cap; a seat limit (``distinct="user"``); a grant on every subject;
a limit with a runaway breaker. Prints the best round's ms per check and
how many checks the reference engine answered (its metric).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import common  # noqa: F401  (first: the package of this checkout, `common.ROOT`)

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.telemetry.metrics import metrics

NOW = datetime(2026, 11, 10, 12, tzinfo=UTC)
SUBJECTS = [f"org-{n}" for n in range(100)]
CALLS = Limit("calls", maximum=10**9, period="1d", window="calendar")


def _reference_checks() -> float:
    found = metrics().registry.get_sample_value(
        "metering_reference_events_total", {"path": "check"}
    )
    return found or 0.0


def _plain(meter: Meter) -> Callable[[str], object]:
    meter.set_limits([CALLS])
    return lambda subject: meter.check(subject, "calls")


def _priced(meter: Meter) -> Callable[[str], object]:
    meter.set_limits([CALLS, spend_limit("cap", "1000", "USD", "1d", window="calendar")])
    meter.set_price("calls", "0.01", "USD")
    return lambda subject: meter.check(subject, "calls")


def _seats(meter: Meter) -> Callable[[str], object]:
    meter.set_limits([Limit("seats", maximum=50, period="1d", window="calendar", distinct="user")])
    return lambda subject: meter.check(subject, "seats", metadata={"user": "u1"})


def _grants(meter: Meter) -> Callable[[str], object]:
    meter.set_limits([CALLS])
    for subject in SUBJECTS:
        meter.grant(subject, "calls", 1_000)
    return lambda subject: meter.check(subject, "calls")


def _breaker(meter: Meter) -> Callable[[str], object]:
    guarded = Limit(
        "calls", maximum=10**9, period="1d", window="calendar", breaker="10x", quarantine_max=5
    )
    meter.set_limits([guarded])
    return lambda subject: meter.check(subject, "calls")


CASES = {
    "plain": _plain,
    "priced + cap": _priced,
    "seats": _seats,
    "grant each": _grants,
    "breaker": _breaker,
}


def run(make: Callable[[Meter], Callable[[str], object]], checks: int) -> tuple[float, float]:
    """(ms per check, reference checks per check) on a fresh file."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        with Meter(url, clock=FrozenClock(NOW)) as meter:
            check = make(meter)
            name = meter.list_limits()[0].name
            for subject in SUBJECTS:  # some usage on each subject, and warm caches
                meter.consume(subject, name, 1, metadata={"user": "u0"})
                check(subject)
            before = _reference_checks()
            began = time.perf_counter()
            for n in range(checks):
                check(SUBJECTS[n % len(SUBJECTS)])
            elapsed = time.perf_counter() - began
            return 1000 * elapsed / checks, (_reference_checks() - before) / checks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':<14} {'ms/check':>9} {'reference':>10}")
    for name, make in CASES.items():
        found = [run(make, args.checks) for _ in range(args.rounds)]
        ms, reference = min(found)
        print(f"{name:<14} {ms:9.3f} {reference:10.2f}")


if __name__ == "__main__":
    main()
