"""Races on seats: 8 processes add the same new value at once (one seat, not
eight), and then new values past the maximum (never over); two meters that
know values held (`HeldCache`) take (in batches and one by one) and free
seats of one window in turn."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.synchronize
import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.decisions import ChargeDecision
from metering.domain.events import make_event
from metering.engine.limit_cache import LimitCache
from metering.engine.one_trip import STATS
from metering.storage.tables import corrections, distinct_values, results
from metering.upkeep.audit import run_audit

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


ROUNDS = 40
USERS = 5  # each process's own: more users than seats, some denied, some take a seat freed


def _churn(url: str, worker: int, start: multiprocessing.synchronize.Event) -> None:
    rng = random.Random(worker)
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        live: dict[str, list[str]] = {}  # user: its events allowed, not voided
        for round in range(ROUNDS):
            users = [f"w{worker}-u{rng.randrange(USERS)}" for _ in range(4)]
            events = [
                make_event([("org-1", "seats", 1)], NOW, f"c{worker}-{round}-{n}", {"user": user})
                for n, user in enumerate(users)
            ]
            # Two consumed one by one first (one trip on PostgreSQL: a value
            # known held, perhaps freed by the last round's void, is told at
            # the stamp it was known at), then two in a batch (the fast path).
            decisions = [
                meter.consume("org-1", "seats", metadata=e.metadata, event_id=e.event_id)
                for e in events[:2]
            ] + [*meter.apply(events[2:])]
            for event, user, decided in zip(events, users, decisions, strict=True):
                if decided.allowed:
                    live.setdefault(user, []).append(event.event_id)
            if live and rng.random() < 0.4:  # free a seat: void every event of a user
                for event_id in live.pop(rng.choice(sorted(live))):
                    meter.void(event_id, "churn")
        cache = meter._engine.path("direct").cache
        assert isinstance(cache, LimitCache) and cache.held.met  # it knew values held
        if url.startswith("postgresql"):
            assert STATS["applied"] > 0  # consumed in one trip


def test_two_meters_knowing_values_held_never_pass_the_maximum(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(LIMIT)
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_churn, args=(db_url, n, start)) for n in range(2)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0, 0]
    # Two minutes on: the audit checks what was decided up to a minute before.
    with Meter(db_url, clock=FrozenClock(NOW + timedelta(minutes=2))) as meter:
        [counter] = meter.counters("org-1", "seats")
        seats = meter.seats("org-1", "seats")
        with meter.sql_engine.connect() as connection:
            query = select(results.c.event_id, results.c.charges, results.c.metadata)
            rows = connection.execute(query).all()
            voided = set(connection.execute(select(corrections.c.event_id)).scalars())
        audit = run_audit(meter, full=True)
    assert audit.windows == 1
    assert audit.violations == ()
    charges = {event_id: ChargeDecision.from_row(json.loads(c)[0]) for event_id, c, _ in rows}
    assert counter.used == len(seats) <= LIMIT.maximum
    assert all(charge.used <= LIMIT.maximum for charge in charges.values())
    assert any(not charge.allowed for charge in charges.values())  # the maximum was met
    # Every value of an event allowed and not voided holds a seat: none got
    # in for nothing as a value known held whose seat was freed meanwhile.
    live = {
        json.loads(metadata)["user"]
        for event_id, _, metadata in rows
        if charges[event_id].allowed and event_id not in voided
    }
    assert live == set(seats)
