"""The overage report with entitlements, grants and corrections, on SQLite and PostgreSQL.

Each test records usage through `Meter` with a frozen clock it moves by
hand, then reads the report: the maximum a row shows is the one that applied
in its window, grant-paid usage is ``granted`` and never overage, and a void
in a past window changes that window's figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter
from metering.reports import ReportRow, overage_report, usage_report


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(at("2026-10-01T09:00"))


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1mo", window="calendar", enforcement="soft"),
                Limit("seats", maximum=5, period="1mo", window="calendar"),
            ]
        )
        yield meter


def consume(
    meter: Meter,
    clock: FrozenClock,
    when: str,
    subject: str,
    limit: str,
    cost: int,
    event_id: str | None = None,
) -> None:
    clock.set(at(when))
    meter.consume(subject, limit, cost=cost, event_id=event_id)


def row(meter: Meter, period: str, subject: str, limit: str) -> ReportRow:
    [found] = overage_report(meter, period=period, subject=subject, limit=limit)
    return found


def figures(found: ReportRow) -> tuple[int, int, int, int, int]:
    return (found.maximum, found.used, found.granted, found.overage, found.denied)


# -- corrections -------------------------------------------------------------------


def test_a_void_in_a_past_window_changes_that_window_and_the_report(
    meter: Meter, clock: FrozenClock
) -> None:
    consume(meter, clock, "2026-10-05T10:00", "org-42", "calls", 80, "batch-1")
    consume(meter, clock, "2026-10-06T10:00", "org-42", "calls", 40, "batch-1-again")
    consume(meter, clock, "2026-10-07T10:00", "org-42", "seats", 5, "seats-1")
    consume(meter, clock, "2026-10-08T10:00", "org-42", "seats", 1)  # denied: 5 + 1 > 5
    consume(meter, clock, "2026-11-03T10:00", "org-42", "calls", 30)
    assert figures(row(meter, "2026-10", "org-42", "calls")) == (100, 120, 0, 20, 0)

    clock.set(at("2026-11-05T12:00"))  # October is a past window now
    meter.void("batch-1-again", "recorded twice")
    meter.void("seats-1", "seats never assigned")

    assert figures(row(meter, "2026-10", "org-42", "calls")) == (100, 80, 0, 0, 0)
    # A void gives usage back, not denials; a hard limit's denials are never overage.
    assert figures(row(meter, "2026-10", "org-42", "seats")) == (5, 0, 0, 0, 1)
    assert figures(row(meter, "2026-11", "org-42", "calls")) == (100, 30, 0, 0, 0)
    assert [c.used for c in meter.counters("org-42", "calls")] == [80, 30]
    # Voiding again changes nothing.
    meter.void("batch-1-again", "recorded twice")
    assert overage_report(meter, period="2026-10", limit="calls")[0].used == 80


# -- entitlements ------------------------------------------------------------------


def test_a_row_keeps_the_maximum_that_applied_in_its_window(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_entitlement("org-42", "calls", 250, effective_from=at("2026-10-01T00:00"))
    consume(meter, clock, "2026-10-20T10:00", "org-42", "calls", 300)
    clock.set(at("2026-11-01T00:00"))
    meter.set_entitlement("org-42", "calls", 1000)  # a later window: October keeps 250
    consume(meter, clock, "2026-11-02T10:00", "org-42", "calls", 300)
    clock.set(at("2026-12-01T00:00"))
    meter.delete_entitlement("org-42", "calls")  # back to the default from December
    consume(meter, clock, "2026-12-02T10:00", "org-42", "calls", 300)

    assert figures(row(meter, "2026-10", "org-42", "calls")) == (250, 300, 0, 50, 0)
    assert figures(row(meter, "2026-11", "org-42", "calls")) == (1000, 300, 0, 0, 0)
    assert figures(row(meter, "2026-12", "org-42", "calls")) == (100, 300, 0, 200, 0)
    assert row(meter, "2026-10", "org-42", "calls").utilisation_percent == 120.0
    history = usage_report(meter, "org-42", limit="calls")
    assert [(r.maximum, r.overage) for r in history] == [(250, 50), (1000, 0), (100, 200)]


def test_a_mid_window_upgrade_is_the_windows_maximum(meter: Meter, clock: FrozenClock) -> None:
    meter.set_entitlement("org-7", "calls", 1000, effective_from=at("2026-11-01T00:00"))
    consume(meter, clock, "2026-11-03T10:00", "org-7", "calls", 900)
    clock.set(at("2026-11-12T00:00"))
    meter.set_entitlement("org-7", "calls", 2000)
    consume(meter, clock, "2026-11-15T10:00", "org-7", "calls", 900)
    assert figures(row(meter, "2026-11", "org-7", "calls")) == (2000, 1800, 0, 0, 0)
    # A hard limit too: the upgraded maximum is what decisions and the report use.
    meter.set_entitlement("org-7", "seats", 8, effective_from=at("2026-11-12T00:00"))
    for day in range(13, 22):  # 9 seats: the 9th is denied
        consume(meter, clock, f"2026-11-{day}T10:00", "org-7", "seats", 1)
    assert figures(row(meter, "2026-11", "org-7", "seats")) == (8, 8, 0, 0, 1)


def test_an_entitlement_from_a_later_window_leaves_earlier_ones_alone(
    meter: Meter, clock: FrozenClock
) -> None:
    consume(meter, clock, "2026-10-20T10:00", "org-1", "calls", 150)
    clock.set(at("2026-10-25T00:00"))
    meter.set_entitlement("org-1", "calls", 500, effective_from=at("2026-11-01T00:00"))
    # It starts at November's first instant, the end of October's window (exclusive).
    assert figures(row(meter, "2026-10", "org-1", "calls")) == (100, 150, 0, 50, 0)


def test_overage_order_and_top_use_the_maximum_that_applied(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_entitlement("big", "calls", 10_000, effective_from=at("2026-10-01T00:00"))
    consume(meter, clock, "2026-10-02T10:00", "big", "calls", 5_000)  # 50%, no overage
    consume(meter, clock, "2026-10-03T10:00", "small", "calls", 130)  # 30 over the default
    consume(meter, clock, "2026-10-04T10:00", "mid", "calls", 110)  # 10 over
    rows = overage_report(meter, period="2026-10")
    assert [(r.subject, r.overage) for r in rows] == [("small", 30), ("mid", 10), ("big", 0)]
    assert [r.subject for r in overage_report(meter, period="2026-10", top=1)] == ["small"]


# -- grants ------------------------------------------------------------------------


def test_grant_paid_usage_is_granted_not_overage_on_a_soft_limit(
    meter: Meter, clock: FrozenClock
) -> None:
    clock.set(at("2026-10-01T00:00"))
    meter.grant("org-42", "calls", 50, at("2026-11-01T00:00"), grant_id="goodwill-oct")
    consume(meter, clock, "2026-10-10T10:00", "org-42", "calls", 90, "a")
    consume(meter, clock, "2026-10-11T10:00", "org-42", "calls", 40, "b")  # 10 own, 30 granted
    assert figures(row(meter, "2026-10", "org-42", "calls")) == (100, 130, 30, 0, 0)
    consume(meter, clock, "2026-10-12T10:00", "org-42", "calls", 45, "c")  # 20 granted, 25 over
    assert figures(row(meter, "2026-10", "org-42", "calls")) == (100, 175, 50, 25, 0)
    # The grant is spent: a new window draws nothing from it.
    consume(meter, clock, "2026-11-02T10:00", "org-42", "calls", 120)
    assert figures(row(meter, "2026-11", "org-42", "calls")) == (100, 120, 0, 20, 0)
    # Voiding an event a grant paid takes the draw back from the window.
    clock.set(at("2026-11-05T00:00"))
    meter.void("c", "duplicate")
    assert figures(row(meter, "2026-10", "org-42", "calls")) == (100, 130, 30, 0, 0)


def test_grant_paid_usage_is_granted_not_overage_on_a_hard_limit(
    meter: Meter, clock: FrozenClock
) -> None:
    clock.set(at("2026-10-01T00:00"))
    meter.grant("org-2", "seats", 3, grant_id="extra-seats")
    for day in range(1, 11):  # 10 seats of 1: 5 own, 3 granted, 2 denied
        consume(meter, clock, f"2026-10-{day:02d}T10:00", "org-2", "seats", 1)
    found = row(meter, "2026-10", "org-2", "seats")
    assert figures(found) == (5, 8, 3, 0, 2)
    assert found.denied_events == 2
