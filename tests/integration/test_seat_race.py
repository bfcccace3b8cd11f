"""Races on seats: 8 processes add the same new value at once (one seat, not
eight), and then new values past the maximum (never over)."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.synchronize
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.decisions import ChargeDecision
from metering.storage.tables import distinct_values, results

PROCESSES = 8
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LIMIT = Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user")

pytestmark = pytest.mark.slow


def _add(url: str, worker: int, start: multiprocessing.synchronize.Event) -> None:
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        # Every process: the same new value first, then values of its own
        # and of its neighbour (more new values than seats).
        meter.consume("org-1", "seats", metadata={"user": "alice"}, event_id=f"w{worker}-alice")
        for n, user in enumerate([f"u{worker}", f"u{(worker + 1) % PROCESSES}", "alice"]):
            meter.consume("org-1", "seats", metadata={"user": user}, event_id=f"w{worker}-{n}")


def test_eight_processes_adding_one_new_value_take_one_seat(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(LIMIT)
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_add, args=(db_url, n, start)) for n in range(PROCESSES)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        [counter] = meter.counters("org-1", "seats")
        seats = meter.seats("org-1", "seats")
        with meter.sql_engine.connect() as connection:
            rows = connection.execute(select(results.c.event_id, results.c.charges)).all()
            query = select(distinct_values.c.value, distinct_values.c.live_events)
            live = {value: count for value, count in connection.execute(query)}
    charges = {event_id: ChargeDecision.from_row(json.loads(c)[0]) for event_id, c in rows}
    alice = [charges[f"w{n}-alice"] for n in range(PROCESSES)]
    assert all(charge.allowed for charge in alice)
    assert sorted(charge.cost for charge in alice) == [0] * (PROCESSES - 1) + [1]  # one seat
    assert live["alice"] == 1  # held (2 * PROCESSES live events)
    assert counter.used == len(seats) == 5  # never over: the maximum, exactly
    assert "alice" in seats
    allowed_new = [c for c in charges.values() if c.allowed and c.cost == 1]
    assert len(allowed_new) == 5
    assert all(c.used <= 5 for c in charges.values())
    denied = [c for c in charges.values() if not c.allowed]
    assert counter.denied_count == len(denied) > 0
    # Every value allowed holds a seat; every value denied was new when it asked.
    assert {user for user, count in live.items() if count} == set(seats)
