"""Quota leases across real processes (issue 20, point 6): four processes
hammer one key of a hard limit of 1,000 through the middleware, on
PostgreSQL; then the same with one of them SIGKILLed holding a lease.

Each process is `lease_hammer.py`: its own `Meter` and lease book, an ASGI
app behind `MeteringMiddleware` (leases on, the default) and four
concurrent clients of one address, on a frozen clock (no lease goes idle:
they are settled when spent and at shutdown, or by the sweeper).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lease_checks import counted, settled_usage

from metering import FrozenClock, Limit, Meter

HAMMER = Path(__file__).with_name("lease_hammer.py")
START = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)
SUBJECT = "192.0.2.7"
MAXIMUM = 1000
TIMEOUT = 120


class Hammer:
    """One `lease_hammer.py` process, ready and waiting for its go."""

    def __init__(self, url: str, *extra: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HAMMER), url, START.isoformat(), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        assert self.line() == "ready"

    def line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def report(self) -> dict[str, int]:
        text = self.line()
        assert text.startswith("{"), f"the process said {text!r}"
        report: dict[str, int] = json.loads(text)
        return report

    def finish(self) -> dict[str, int]:
        report = self.report()
        assert self.line() == "settled"
        assert self.process.wait(TIMEOUT) == 0
        return report

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(TIMEOUT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    """The test's own view of the database, a minute after the hammering:
    every lease taken at START has expired by then."""
    clock = FrozenClock(START + timedelta(seconds=60))
    with Meter(pg_url, clock=clock) as m:
        m.set_limit(Limit("hard", maximum=MAXIMUM, period="1h", window="calendar"))
        yield m


@pytest.fixture
def hammers() -> Iterator[list[Hammer]]:
    started: list[Hammer] = []
    yield started
    for hammer in started:
        hammer.close()


def test_four_processes_never_allow_more_than_the_maximum(
    pg_url: str, meter: Meter, hammers: list[Hammer]
) -> None:
    hammers += [Hammer(pg_url) for _ in range(4)]
    for hammer in hammers:
        hammer.go()
    reports = [hammer.finish() for hammer in hammers]
    allowed = sum(r["allowed"] for r in reports)
    assert 990 <= allowed <= MAXIMUM
    assert all(r["denied"] >= 1 for r in reports)
    # Every process settled its leases at shutdown: nothing is held, and the
    # counter is what the ledger says was used.
    assert meter.sweep_reservations()["committed"] == 0
    assert counted(meter, SUBJECT, "hard") == settled_usage(meter, SUBJECT, "hard") == allowed
    # More than one process decided from leases (blocks of more than one unit).
    blocks = [r.charges[0].cost for r in meter.reservations(subject=SUBJECT, count=10_000)]
    assert max(blocks) > 1


def test_a_process_killed_holding_a_lease_never_causes_an_over_grant(
    pg_url: str, meter: Meter, hammers: list[Hammer]
) -> None:
    victim = Hammer(pg_url, "--hold", "10")
    hammers.append(victim)
    victim.go()
    held = victim.report()
    assert held["holding"] >= 10
    victim.kill()  # SIGKILL: it never settles its lease

    hammers += [Hammer(pg_url) for _ in range(3)]
    for hammer in hammers[1:]:
        hammer.go()
    reports = [hammer.finish() for hammer in hammers[1:]]
    allowed = held["allowed"] + sum(r["allowed"] for r in reports)
    # The victim's unused units are lost for this window: under, never over.
    assert allowed == MAXIMUM - held["holding"]
    assert counted(meter, SUBJECT, "hard") == MAXIMUM
    # Its reservations expired (the test's clock is past them): the sweeper
    # commits them in full (the one it held, and any spent block it had not
    # yet settled), and the counter is the ledger's settled usage.
    assert meter.sweep_reservations()["committed"] >= 1
    assert counted(meter, SUBJECT, "hard") == settled_usage(meter, SUBJECT, "hard") == MAXIMUM
