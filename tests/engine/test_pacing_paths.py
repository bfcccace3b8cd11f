"""Paced limits through `Meter`, on SQLite and PostgreSQL, on a frozen clock.

A paced limit is decided on the fast path (a single event on PostgreSQL by
the one-trip function); `tests/engine/test_differential.py` holds every path
to the reference engine with paced limits in the streams. Here, the
contract example by example: a month's budget spent at its pace, a denial's
``retry_at`` that is exactly when the charge fits, grants that are not
paced, an entitlement's maximum paced, and a soft limit ahead of its pace.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter
from metering.domain.needs import Need
from metering.engine.one_trip import ONE_TRIP_IMPLEMENTS

NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
BUDGET = Limit("budget", maximum=3000, period="1mo", window="calendar", pacing=True)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOVEMBER)) as meter:
        meter.set_limit(BUDGET)
        yield meter


def test_a_monthly_budget_lasts_the_month(meter: Meter) -> None:
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    assert meter.consume("org-1", "budget", 150).allowed  # the burst: 5 % of 3,000
    denied = meter.consume("org-1", "budget", 10)
    assert denied.outcome == "denied" and denied.used == 150
    # Back on pace when 10 more units are paced: 10 x 864 s (30 days / 3,000).
    assert denied.retry_at == NOVEMBER + timedelta(seconds=8640)
    clock.advance(seconds=8639)
    assert not meter.consume("org-1", "budget", 10).allowed
    clock.advance(seconds=1)
    assert meter.consume("org-1", "budget", 10).used == 160
    # By the 30th, the whole month's maximum is allowed; never more.
    clock.set(NOVEMBER + timedelta(days=29, hours=23))
    assert meter.consume("org-1", "budget", 2840).used == 3000
    over = meter.consume("org-1", "budget", 1)
    assert over.outcome == "denied" and over.retry_at == datetime(2026, 12, 1, tzinfo=UTC)


def test_grants_are_not_paced_and_an_entitlement_is(meter: Meter) -> None:
    meter.grant("org-1", "budget", 500, grant_id="top-up")
    decided = meter.consume("org-1", "budget", 650)  # 150 of pace, then 500 of grant
    assert decided.allowed and decided.charges[0].grants == (("top-up", 500),)
    assert not meter.consume("org-1", "budget", 1).allowed
    meter.set_entitlement("org-2", "budget", 30_000)
    assert meter.consume("org-2", "budget", 1500).allowed  # 5 % of 30,000
    assert not meter.consume("org-2", "budget", 1).allowed


def test_a_soft_limit_ahead_of_its_pace_is_allowed_and_not_billed(meter: Meter) -> None:
    meter.set_limit(
        Limit(
            "soft_budget",
            maximum=3000,
            period="1mo",
            window="calendar",
            enforcement="soft",
            pacing=True,
            burst=0,
        )
    )
    ahead = meter.consume("org-1", "soft_budget", 2000)
    assert ahead.outcome == "allowed"
    assert ahead.charges[0].outcome == "ahead_of_pace" and ahead.charges[0].overage == 0
    over = meter.consume("org-1", "soft_budget", 1500)
    assert (over.outcome, over.charges[0].outcome, over.charges[0].overage) == (
        "overage",
        "overage",
        500,
    )


def test_a_shadow_limit_records_what_the_pace_would_deny(meter: Meter) -> None:
    meter.set_limit(
        Limit(
            "watch", maximum=100, period="1d", window="calendar", enforcement="shadow", pacing=True
        )
    )
    assert meter.consume("org-1", "watch", 5).charges[0].outcome == "allowed"
    shadow = meter.consume("org-1", "watch", 1)
    assert shadow.allowed and shadow.would_deny == ("watch",)


def test_the_pace_is_stored_and_declared() -> None:
    assert Need.PACING in ONE_TRIP_IMPLEMENTS
    assert BUDGET.to_dict()["burst"] == "5%"


def test_a_paced_limit_survives_a_reload(meter: Meter, db_url: str) -> None:
    meter.set_limit(Limit("units", maximum=10, period="1h", pacing=True, burst=3))
    with Meter(db_url) as other:
        found = {limit.name: limit for limit in other.list_limits()}
    assert found["budget"] == BUDGET
    assert (found["units"].pacing, found["units"].burst) == (True, 3)
