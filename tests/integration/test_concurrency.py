"""No lost updates: processes racing on one counter never exceed a hard limit."""

from __future__ import annotations

import multiprocessing
from collections import Counter as Tally
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.storage.tables import results

PROCESSES = 8
CALLS = 500
MAXIMUM = 1000
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.slow


def _consume_many(url: str, worker: int, start: multiprocessing.synchronize.Event) -> None:
    meter = Meter(url, clock=FrozenClock(NOW))
    start.wait(30)
    for n in range(CALLS):
        meter.consume("org-1", "calls", event_id=f"w{worker}-{n}")
    meter.close()


def _race(url: str) -> None:
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_consume_many, args=(url, n, start)) for n in range(PROCESSES)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES


def test_racing_processes_never_exceed_a_hard_limit(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=MAXIMUM, period="1d", window="calendar"))
    _race(db_url)
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        [counter] = meter.counters("org-1", "calls")
        with meter.engine.connect() as connection:
            outcomes = Tally(connection.execute(select(results.c.outcome)).scalars())
    assert outcomes == {"allowed": MAXIMUM, "denied": PROCESSES * CALLS - MAXIMUM}
    assert counter.used == MAXIMUM
    assert counter.denied_count == PROCESSES * CALLS - MAXIMUM
