"""The pure rules of recurring grants, grant.low and per-subject alert
thresholds (`metering.domain.recurring`, `metering.domain.alerts`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.domain.alerts import parse_points, shown_points
from metering.domain.grants import Balance, Pot
from metering.domain.instants import to_us
from metering.domain.limits import parse_period
from metering.domain.recurring import (
    Issue,
    issue_id,
    issues_due,
    low_threshold,
    next_due_us,
    parse_low,
    period_end,
    rolled_over,
)
from metering.errors import InvalidInput

MONTH = parse_period("1mo")


def us(*args: int) -> int:
    return to_us(datetime(*args, tzinfo=UTC))


def test_issue_ids_are_the_schedules_then_numbered() -> None:
    assert [issue_id("m", n) for n in (1, 2, 10)] == ["m", "m/2", "m/10"]


def test_a_period_ends_at_the_calendar_boundary_or_one_period_on() -> None:
    start = us(2026, 11, 20, 12)
    assert period_end(MONTH, calendar=True, start_us=start, until_us=None) == us(2026, 12, 1)
    assert period_end(MONTH, calendar=False, start_us=start, until_us=None) == us(2026, 12, 20, 12)
    assert period_end(MONTH, calendar=True, start_us=start, until_us=us(2026, 11, 25)) == us(
        2026, 11, 25
    )


def test_rollover_adds_what_was_left_up_to_its_maximum() -> None:
    assert rolled_over(10, 0, 7) == 10
    assert rolled_over(10, 5, 7) == 15
    assert rolled_over(10, 5, 3) == 13
    assert rolled_over(10, 5, -1) == 10  # never less than the amount


def test_issues_due_catch_up_each_rolling_over_the_last() -> None:
    last = Issue(1, us(2026, 11, 20), us(2026, 12, 1), 10)
    assert issues_due(MONTH, calendar=True, amount=10, rollover_max=4, until_us=None,
                      last=last, left_of_last=3, now_us=us(2026, 11, 30)) == []  # fmt: skip
    found = issues_due(MONTH, calendar=True, amount=10, rollover_max=4, until_us=None,
                       last=last, left_of_last=3, now_us=us(2027, 1, 15))  # fmt: skip
    assert found == [
        Issue(2, us(2026, 12, 1), us(2027, 1, 1), 13),
        Issue(3, us(2027, 1, 1), us(2027, 2, 1), 14),  # the unread December left all 13
    ]
    assert next_due_us(found[-1], None) == us(2027, 2, 1)


def test_no_issue_starts_at_or_after_until() -> None:
    until = us(2027, 1, 10)
    last = Issue(1, us(2026, 11, 20), us(2026, 12, 1), 5)
    found = issues_due(MONTH, calendar=True, amount=5, rollover_max=0, until_us=until,
                       last=last, left_of_last=0, now_us=us(2027, 6, 1))  # fmt: skip
    assert [(i.number, i.end_us) for i in found] == [(2, us(2027, 1, 1)), (3, until)]
    assert next_due_us(found[-1], until) is None


def test_grant_low_in_units_or_percent() -> None:
    assert parse_low("20%") == (None, 20)
    assert parse_low("500") == (500, None)
    assert parse_low(0) == (0, None)
    assert low_threshold(250, None, 20) == 50
    assert low_threshold(250, 7, None) == 7
    assert low_threshold(250, None, None) is None
    for bad in ("0%", "101%", "x", "-1", -1, True, 1.5, "5 %%"):
        with pytest.raises(InvalidInput):
            parse_low(bad)


def test_priority_comes_before_expiry_in_the_draw() -> None:
    pot = Pot([Balance("soon", 5, 0, 0, 100), Balance("first", 5, 0, 0, None, priority=1)])
    assert pot.plan(7, 50) == [("first", 5), ("soon", 2)]


def test_alert_points_are_percentages_and_amounts() -> None:
    assert parse_points(["80%", "5000", 90, "50 %"]) == ((50, 80), (90, 5000))
    assert shown_points((50, 80), (90,)) == ["50%", "80%", "90"]
    assert parse_points("80%") == ((80,), ())
    for bad in ([], ["0%"], ["1001%"], [0], [True], ["x"], [None], ["10" * 10]):
        with pytest.raises(InvalidInput):
            parse_points(bad)
