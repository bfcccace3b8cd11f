"""Races on entitlements, grants and corrections: 8 processes on one counter.

Every allowed charge's row records the counter after it and the maximum in
effect when it was decided; a hard limit is never exceeded if no allowed
row's own usage (``used`` less what grants paid in its window) is above its
maximum, and the counter equals the allowed costs less the voided ones.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.decisions import ChargeDecision
from metering.storage.tables import counters, results

PROCESSES = 8
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
YESTERDAY = timedelta(hours=13)
LIMIT = Limit("calls", maximum=100, period="1d", window="calendar")

pytestmark = pytest.mark.slow


def _race(
    url: str,
    target: Callable[..., None],
    calls: int,
    extra: Callable[..., None] | None,
    *signals: object,
) -> None:
    """Runs 8 ``target`` processes (and ``extra``) from one start signal.

    ``signals`` are more synchronisation objects handed to every process.
    """
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [
        context.Process(target=target, args=(url, n, calls, start, *signals))
        for n in range(PROCESSES)
    ]
    if extra is not None:
        procs.append(context.Process(target=extra, args=(url, start, *signals)))
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)


def _consume(url: str, worker: int, calls: int, start: multiprocessing.synchronize.Event) -> None:
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        for n in range(calls):
            meter.consume("org-1", "calls", 1 + (n + worker) % 3, event_id=f"w{worker}-{n}")


def _consume_two_days(
    url: str, worker: int, calls: int, start: multiprocessing.synchronize.Event
) -> None:
    """Half the workers charge yesterday's window: both windows draw on the same grants."""
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        at = NOW - YESTERDAY if worker % 2 else NOW
        for n in range(calls):
            cost = 1 + (n + worker) % 3
            meter.consume("org-1", "calls", cost, event_id=f"w{worker}-{n}", occurred_at=at)


def _rows(meter: Meter) -> list[tuple[str, str, ChargeDecision]]:
    with meter.sql_engine.connect() as connection:
        found = connection.execute(select(results.c.event_id, results.c.outcome, results.c.charges))
        import json

        return [
            (event_id, outcome, ChargeDecision.from_row(json.loads(charges)[0]))
            for event_id, outcome, charges in found
        ]


def _consume_around_a_change(
    url: str,
    worker: int,
    calls: int,
    start: multiprocessing.synchronize.Event,
    raised: multiprocessing.synchronize.Event,
    charged: multiprocessing.synchronize.Semaphore,
) -> None:
    """Half the calls, then a wait until the maximum is raised, then the rest.

    The first call after the wait is signalled, so the changer knows every worker
    has charged once against the raised maximum before it changes it again: the
    race always sees a raise, however the processes are scheduled.
    """
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        for n in range(calls):
            if n == calls // 2:
                assert raised.wait(120)
            meter.consume("org-1", "calls", 1 + (n + worker) % 3, event_id=f"w{worker}-{n}")
            if n == calls // 2:
                charged.release()


def _change_entitlement(
    url: str,
    start: multiprocessing.synchronize.Event,
    raised: multiprocessing.synchronize.Event,
    charged: multiprocessing.synchronize.Semaphore,
) -> None:
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        meter.set_entitlement("org-1", "calls", 60, effective_from=NOW)
        meter.set_entitlement("org-1", "calls", 150, effective_from=NOW)
        raised.set()
        for _ in range(PROCESSES):
            assert charged.acquire(timeout=120)
        for maximum in [40, 220, 90, 300, 70] + [60, 150, 40, 220, 90, 300, 70] * 2:
            meter.set_entitlement("org-1", "calls", maximum, effective_from=NOW)


def test_an_entitlement_changed_during_a_race_is_never_exceeded(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(LIMIT)
        meter.set_entitlement("org-1", "calls", 50, effective_from=NOW)
    context = multiprocessing.get_context("fork")
    raised, charged = context.Event(), context.Semaphore(0)
    _race(db_url, _consume_around_a_change, 60, _change_entitlement, raised, charged)
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        rows = _rows(meter)
        [counter] = meter.counters("org-1", "calls")
    allowed = [charge for _, outcome, charge in rows if outcome == "allowed"]
    denied = [charge for _, outcome, charge in rows if outcome == "denied"]
    assert len(rows) == PROCESSES * 60
    assert {charge.maximum for charge in allowed} <= {50, 60, 150, 40, 220, 90, 300, 70}
    assert all(charge.used <= charge.maximum for charge in allowed)
    assert all(charge.used + charge.cost > charge.maximum for charge in denied)
    assert counter.used == sum(charge.cost for charge in allowed)
    assert counter.denied_count == len(denied)
    assert max(charge.used for charge in allowed) > 60  # the raise to 150 was seen


def test_a_grant_tops_up_a_hard_limit_exactly_under_a_race(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(LIMIT)
        meter.grant(
            "org-1", "calls", 150, grant_id="early", expires_at=datetime(2026, 12, 1, tzinfo=UTC)
        )
        meter.grant("org-1", "calls", 50, grant_id="forever")
    _race(db_url, _consume_two_days, 40, None)
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        rows = _rows(meter)
        windows = meter.counters("org-1", "calls")
        used = {grant.grant_id: grant.used for grant in meter.grants()}
        with meter.sql_engine.connect() as connection:
            draws = {
                row.window_start_us: row.granted
                for row in connection.execute(select(counters).where(counters.c.granted != 0))
            }
    allowed = [charge for _, outcome, charge in rows if outcome == "allowed"]
    paid = {}
    for charge in allowed:
        for grant_id, amount in charge.grants:
            paid[grant_id] = paid.get(grant_id, 0) + amount
    total = sum(window.used for window in windows)
    assert len(windows) == 2
    assert total == sum(charge.cost for charge in allowed)
    assert 400 - 4 <= total <= 400  # costs of 1 to 3 fill all but the last units
    assert used == paid
    assert sum(draws.values()) == sum(paid.values())
    assert used["early"] == 150  # drawn first: it expires first
    assert used["forever"] <= 50
    assert all(window.used <= 100 + 200 for window in windows)
    assert total - sum(used.values()) <= 200  # each window's own 100


def _void_all(url: str, start: multiprocessing.synchronize.Event) -> None:
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        for n in range(100):
            meter.void(f"pre-{n}", "recorded twice")
            meter.void(f"pre-{n}", "recorded twice")  # a second void counts once


def _consume_big(
    url: str, worker: int, calls: int, start: multiprocessing.synchronize.Event
) -> None:
    _consume(url, worker, calls, start)


def test_voids_racing_new_usage_on_the_same_counter_stay_exact(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10_000, period="1d", window="calendar"))
        for n in range(100):
            meter.consume("org-1", "calls", 2, event_id=f"pre-{n}")
    _race(db_url, _consume_big, 40, _void_all)
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        rows = _rows(meter)
        [counter] = meter.counters("org-1", "calls")
        voided = {c.event_id for c in meter.corrections()}
    assert len(voided) == 100
    allowed = [(e, charge) for e, outcome, charge in rows if outcome == "allowed"]
    assert len(allowed) == 100 + PROCESSES * 40
    kept = sum(charge.cost for event_id, charge in allowed if event_id not in voided)
    assert counter.used == kept
