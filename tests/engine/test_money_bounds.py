"""A priced charge that would cost more than the largest amount is refused on
both databases and every path, with the same `InvalidInput`, and nothing is
stored: `consume`, a batch (raised, or rejected as the worker keeps it),
`check` and `reserve`; with no spend limit, and with a soft one."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.domain.decisions import Decision
from metering.errors import InvalidInput
from metering.storage.tables import counters, results, usage_rollup_deltas, usage_rollups

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
MESSAGE = "cost: 1,000,000,000,000 units of 'big' at 10000000.00 USD a unit cost more than"


@pytest.fixture(params=["no spend limit", "soft spend limit"])
def meter(db_url: str, request: pytest.FixtureRequest) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("big", maximum=10**12, period="1d"))
        m.set_price("big", "10000000", "USD")
        if request.param == "soft spend limit":
            m.set_limit(spend_limit("spend", "1000", "USD", "1mo", enforcement="soft"))
        yield m


def rows(meter: Meter) -> list[int]:
    with meter.sql_engine.connect() as connection:
        return [
            connection.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (results, counters, usage_rollups, usage_rollup_deltas)
        ]


def test_every_path_refuses_it_and_stores_nothing(meter: Meter) -> None:
    event = make_event([("org-x", "big", 10**12)], NOW, "e-1")
    calls = [
        lambda: meter.consume("org-x", "big", 10**12),
        lambda: meter.consume("org-x", "big", 10**10),
        lambda: meter.apply([event], invalid="raise"),
        lambda: meter.apply(
            [event, make_event([("org-x", "big", 1)], NOW, "e-2")], invalid="raise"
        ),
        lambda: meter.check("org-x", "big", 10**12),
        lambda: meter.reserve("org-x", "big", 10**12),
    ]
    for call in calls:
        with pytest.raises(InvalidInput, match="the most one charge may cost"):
            call()
    with pytest.raises(InvalidInput) as refused:
        meter.consume("org-x", "big", 10**12)
    assert str(refused.value).startswith(MESSAGE)
    assert rows(meter) == [0, 0, 0, 0]


def test_a_worker_batch_rejects_it_and_applies_the_rest(meter: Meter) -> None:
    big = make_event([("org-x", "big", 10**12)], NOW, "e-1")
    small = make_event([("org-x", "big", 2)], NOW, "e-2")
    rejected, applied = meter.apply([big, small], invalid="reject")
    assert isinstance(rejected, Decision) and isinstance(applied, Decision)
    assert rejected.outcome == "rejected" and str(rejected.reason).startswith(MESSAGE)
    assert applied.allowed
    assert meter.counters("org-x", "big")[0].used == 2
