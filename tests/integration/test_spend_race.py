"""8 processes race for the last cent of a hard spend cap: never over.

Each process charges a priced limit again and again; every charge also
charges the subject's spend limit, in the same transaction. The cap is
never crossed, the spend counter equals the allowed events' amounts (each
rounded half to even on its own), and what was denied was denied by the
spend cap.
"""

from __future__ import annotations

import json
import multiprocessing
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.decisions import ChargeDecision
from metering.storage.tables import results

PROCESSES = 8
CALLS = 12
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CAP_CENTS = 100
# 3.5 cents a unit: a cost of 1 is 4 cents (3.5 to even), 2 is 7, 3 is 10 (10.5 to even).
AMOUNTS = {1: 4, 2: 7, 3: 10}

pytestmark = pytest.mark.slow


def _consume(url: str, worker: int, start: multiprocessing.synchronize.Event) -> None:
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        start.wait(30)
        for n in range(CALLS):
            meter.consume("org-1", "calls", 1 + (n + worker) % 3, event_id=f"w{worker}-{n}")


def test_eight_processes_never_spend_past_a_hard_cap(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10_000, period="1mo", window="calendar"))
        meter.set_limit(spend_limit("spend", "1.00", "USD", "1mo", window="calendar"))
        meter.set_price("calls", "0.035", "USD")
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_consume, args=(db_url, n, start)) for n in range(PROCESSES)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        [spent] = meter.counters("org-1", "spend")
        [calls] = meter.counters("org-1", "calls")
        with meter.sql_engine.connect() as connection:
            found = connection.execute(
                select(results.c.outcome, results.c.denied_by, results.c.charges)
            ).all()
    assert len(found) == PROCESSES * CALLS
    allowed = [
        [ChargeDecision.from_row(row) for row in json.loads(charges)]
        for outcome, _, charges in found
        if outcome == "allowed"
    ]
    denied = [by.split(",") for outcome, by, _ in found if outcome == "denied"]
    assert spent.used <= CAP_CENTS
    assert spent.used > CAP_CENTS - max(AMOUNTS.values())  # the cap was reached
    assert spent.used == sum(AMOUNTS[charges[0].cost] for charges in allowed)
    assert calls.used == sum(charges[0].cost for charges in allowed)
    for charges in allowed:
        call, spend = charges
        assert call.price == ("USD", AMOUNTS[call.cost])
        assert (spend.limit, spend.cost) == ("spend", AMOUNTS[call.cost])
        assert spend.used <= CAP_CENTS
    assert denied and all(by == ["spend"] for by in denied)
    assert spent.denied_count == len(denied)
