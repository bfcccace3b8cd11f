"""A reset or a lowered entitlement reaches every process's leases (PostgreSQL).

Three `lease_holder.py` processes each hold a lease of one key of a hard
limit, on a frozen clock (no lease would ever stop serving by itself). The
test lowers the key's entitlement, or resets it, from a fourth `Meter`;
once each process has seen the change notice (``LISTEN/NOTIFY``), its next
decisions honour the new maximum: no unit of a lease taken before the
change is served after it. Counts are asserted, not timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from metering import FrozenClock, Limit, Meter

HOLDER = Path(__file__).with_name("lease_holder.py")
START = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)
SUBJECT = "org-7"
LIMIT = "hard"
MAXIMUM = 1000
TIMEOUT = 120

pytestmark = pytest.mark.slow


class Holder:
    """One `lease_holder.py` process, holding a lease once started."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HOLDER), url, START.isoformat(), SUBJECT, LIMIT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        self.held = self.report()

    def report(self) -> dict[str, int]:
        assert self.process.stdout is not None
        text = self.process.stdout.readline().strip()
        assert text.startswith("{"), f"the process said {text!r}"
        report: dict[str, int] = json.loads(text)
        return report

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            self.send("close")
            self.process.wait(TIMEOUT)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url, clock=FrozenClock(START)) as m:
        m.set_limit(Limit(LIMIT, maximum=MAXIMUM, period="1h", window="calendar"))
        yield m


@pytest.fixture
def holders(pg_url: str, meter: Meter) -> Iterator[list[Holder]]:
    started: list[Holder] = []
    try:
        started += [Holder(pg_url) for _ in range(3)]
        assert all(h.held["holding"] > 0 for h in started)
        yield started
    finally:
        for holder in started:
            holder.close()


def after(holders: list[Holder]) -> list[dict[str, int]]:
    for holder in holders:
        holder.send("change")
    return [holder.report() for holder in holders]


def test_a_lowered_entitlement_stops_every_process_leases(
    meter: Meter, holders: list[Holder]
) -> None:
    used = sum(c.used for c in meter.counters(SUBJECT, LIMIT))
    assert used > 50  # what the processes used and hold
    meter.set_entitlement(SUBJECT, LIMIT, 50)
    reports = after(holders)
    assert all(r["notices"] >= 1 for r in reports)
    assert [r["allowed"] for r in reports] == [0, 0, 0]


def test_a_reset_stops_every_process_leases(meter: Meter, holders: list[Holder]) -> None:
    meter.reset(subject=SUBJECT, limit=LIMIT)
    reports = after(holders)
    assert all(r["notices"] >= 1 for r in reports)
    # The window starts over: at most its maximum is allowed after the reset,
    # none of it from units leased before.
    assert 0 < sum(r["allowed"] for r in reports) <= MAXIMUM
