"""The pure rules of recurring grants and grant.low (`metering.domain.recurring`);
the per-subject alert thresholds' are in test_alerts.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from metering.domain.grants import Balance, Pot
from metering.domain.instants import to_us
from metering.domain.limits import parse_period
from metering.domain.recurring import (
    MAX_ISSUES_AT_ONCE,
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


def _due(last: Issue, now_us: int, **given: Any) -> list[Issue]:
    """`issues_due` of a monthly grant of 10, calendar, no rollover, no end,
    after ``last`` with nothing left of it; ``given`` changes any of those."""
    options: dict[str, Any] = {
        "calendar": True,
        "amount": 10,
        "rollover_max": 0,
        "until_us": None,
        "left_of_last": 0,
    }
    return issues_due(MONTH, **(options | given), last=last, now_us=now_us)


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
    assert _due(last, us(2026, 11, 30), rollover_max=4, left_of_last=3) == []
    found = _due(last, us(2027, 1, 15), rollover_max=4, left_of_last=3)
    assert found == [
        Issue(2, us(2026, 12, 1), us(2027, 1, 1), 13),
        Issue(3, us(2027, 1, 1), us(2027, 2, 1), 14),  # the unread December left all 13
    ]
    assert next_due_us(found[-1], None) == us(2027, 2, 1)


def test_no_issue_starts_at_or_after_until() -> None:
    until = us(2027, 1, 10)
    last = Issue(1, us(2026, 11, 20), us(2026, 12, 1), 5)
    found = _due(last, us(2027, 6, 1), amount=5, until_us=until)
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


def test_an_issue_is_due_at_the_instant_the_last_one_ends() -> None:
    last = Issue(1, us(2026, 11, 20), us(2026, 12, 1), 10)
    found = _due(last, us(2026, 12, 1))
    assert found == [Issue(2, us(2026, 12, 1), us(2027, 1, 1), 10)]


def test_after_an_issue_cut_short_the_next_ends_at_the_calendar_boundary() -> None:
    # The last issue ended at a former `until` (10 December), since lifted.
    last = Issue(1, us(2026, 11, 20), us(2026, 12, 10), 10)
    calendar = _due(last, us(2026, 12, 10))
    assert calendar == [Issue(2, us(2026, 12, 10), us(2027, 1, 1), 10)]
    first_use = _due(last, us(2026, 12, 10), calendar=False)
    assert first_use == [Issue(2, us(2026, 12, 10), us(2027, 1, 10), 10)]


def test_one_reading_makes_at_most_1200_issues() -> None:
    last = Issue(1, us(1900, 1, 1), us(1900, 2, 1), 1)
    found = _due(last, us(2026, 12, 1), amount=1)
    assert len(found) == MAX_ISSUES_AT_ONCE == 1200
    assert found[-1] == Issue(1201, us(2000, 1, 1), us(2000, 2, 1), 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100%", (None, 100)),
        ("1%", (None, 1)),
        ("1" + "0" * 15, (10**15, None)),
        (10**15, (10**15, None)),
    ],
)
def test_grant_low_at_its_bounds(text: object, expected: tuple[int | None, int | None]) -> None:
    assert parse_low(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (True, "must be a number of units or a percentage, got True"),
        (1.5, "must be a number of units or a percentage, got 1.5"),
        ("0100%", "a percentage must be 1% to 100%, got '0100%'"),
        ("0%", "a percentage must be 1% to 100%, got '0%'"),
        ("1" * 17, "must be a whole number of units or a percentage, got '11111111111111111'"),
        ("1" + "0" * 14 + "1", "must be between 0 and 10**15 units, got 1000000000000001"),
        (10**15 + 1, "must be between 0 and 10**15 units, got 1000000000000001"),
        (-1, "must be between 0 and 10**15 units, got -1"),
    ],
)
def test_a_bad_grant_low_says_why(text: object, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_low(text)
    assert (raised.value.field, str(raised.value)) == ("low", f"low: {message}")


def test_a_low_percentage_rounds_down_to_whole_units() -> None:
    threshold = low_threshold(7, None, 50)
    assert threshold == 3
    assert type(threshold) is int


def test_calendar_issues_follow_the_subjects_zone() -> None:
    """Berlin's months start at its midnight: 22:00 UTC the day before, in summer."""
    last = Issue(1, us(2026, 2, 28, 23), us(2026, 3, 31, 22), 10)
    found = _due(last, us(2026, 5, 15), zones=((0, "Europe/Berlin"),))
    assert found == [
        Issue(2, us(2026, 3, 31, 22), us(2026, 4, 30, 22), 10),
        Issue(3, us(2026, 4, 30, 22), us(2026, 5, 31, 22), 10),
    ]
