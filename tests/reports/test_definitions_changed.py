"""A past window's report row keeps the default maximum and enforcement it was decided with.

On SQLite and PostgreSQL: usage is recorded through `Meter` with a clock the test moves,
November's report is read, the limit's definition changes in December, and November's report
is read again: unchanged. A window takes the definition in force at its end (the latest change
before its exclusive end), so a window spanning a change takes the new one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter
from metering.reports import ReportRow, overage_report, shadow_report, usage_report


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def calls(maximum: int, enforcement: str = "soft") -> Limit:
    return Limit("calls", maximum=maximum, period="1mo", window="calendar", enforcement=enforcement)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(at("2026-10-01T09:00"))


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(calls(1000))
        yield meter


def consume(meter: Meter, clock: FrozenClock, when: str, subject: str, cost: int) -> None:
    clock.set(at(when))
    meter.consume(subject, "calls", cost=cost)


def figures(found: ReportRow) -> tuple[str, int, int, int]:
    return (found.enforcement, found.maximum, found.used, found.overage)


def november(meter: Meter) -> list[ReportRow]:
    return overage_report(meter, period="2026-11", limit="calls")


def redefine(meter: Meter, clock: FrozenClock, when: str, limit: Limit) -> None:
    clock.set(at(when))
    meter.set_limit(limit)


@pytest.mark.parametrize(
    ("changed", "before"),
    [
        (calls(2000), ("soft", 1000, 1500, 500)),  # raised: the overage would shrink to 0
        (calls(500), ("soft", 1000, 1500, 500)),  # lowered: it would grow to 1,000
        (calls(1000, "hard"), ("soft", 1000, 1500, 500)),  # soft to hard: it would be 0
    ],
)
def test_novembers_report_is_unchanged_after_a_december_change(
    meter: Meter, clock: FrozenClock, changed: Limit, before: tuple[str, int, int, int]
) -> None:
    consume(meter, clock, "2026-11-10T10:00", "org-1", 1500)
    clock.set(at("2026-12-02T09:00"))
    report = november(meter)
    assert [figures(row) for row in report] == [before]
    redefine(meter, clock, "2026-12-03T09:00", changed)
    assert november(meter) == report
    # December's window, open at the change, ends under the new definition.
    consume(meter, clock, "2026-12-04T10:00", "org-1", 100)
    [december] = overage_report(meter, period="2026-12", limit="calls")
    assert (december.enforcement, december.maximum) == (changed.enforcement, changed.maximum)


def test_a_hard_limit_made_soft_keeps_novembers_rows_hard(meter: Meter, clock: FrozenClock) -> None:
    redefine(meter, clock, "2026-10-01T09:00", calls(1000, "hard"))
    consume(meter, clock, "2026-11-10T10:00", "org-1", 900)
    consume(meter, clock, "2026-11-11T10:00", "org-1", 200)  # denied: 900 + 200 > 1000
    clock.set(at("2026-12-02T09:00"))
    report = november(meter)
    assert [(figures(r), r.denied) for r in report] == [(("hard", 1000, 900, 0), 200)]
    # Made soft and lowered: November was hard, its denials are not billed as overage.
    redefine(meter, clock, "2026-12-03T09:00", calls(600, "soft"))
    assert november(meter) == report
    [row] = usage_report(meter, "org-1", limit="calls")
    assert figures(row) == ("hard", 1000, 900, 0)


def test_a_change_at_a_windows_end_applies_from_the_next_window(
    meter: Meter, clock: FrozenClock
) -> None:
    consume(meter, clock, "2026-11-10T10:00", "org-1", 1500)
    redefine(meter, clock, "2026-12-01T00:00", calls(2000))  # November's end: exclusive
    consume(meter, clock, "2026-12-01T10:00", "org-1", 1500)
    rows = usage_report(meter, "org-1", limit="calls")
    assert [figures(row) for row in rows] == [("soft", 1000, 1500, 500), ("soft", 2000, 1500, 0)]


def test_a_window_spanning_changes_takes_the_definition_at_its_end(
    meter: Meter, clock: FrozenClock
) -> None:
    consume(meter, clock, "2026-11-02T10:00", "org-1", 1500)
    redefine(meter, clock, "2026-11-10T09:00", calls(800, "hard"))
    redefine(meter, clock, "2026-11-20T09:00", calls(1200))
    [row] = november(meter)
    assert figures(row) == ("soft", 1200, 1500, 300)
    redefine(meter, clock, "2026-12-20T09:00", calls(5000))  # after its end: not November's
    assert figures(november(meter)[0]) == ("soft", 1200, 1500, 300)


def test_an_entitlement_removed_falls_back_to_the_default_at_the_windows_end(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_entitlement("org-1", "calls", 5000, effective_from=at("2026-10-01T00:00"))
    consume(meter, clock, "2026-10-10T10:00", "org-1", 1500)
    consume(meter, clock, "2026-11-10T10:00", "org-1", 1500)
    clock.set(at("2026-11-15T09:00"))
    meter.delete_entitlement("org-1", "calls")  # back to the default from now
    redefine(meter, clock, "2026-11-20T09:00", calls(1200))
    redefine(meter, clock, "2026-12-03T09:00", calls(3000))
    rows = usage_report(meter, "org-1", limit="calls")
    # October: the entitlement; November: the default in force at its end, not
    # the one of the removal (1,000) nor today's (3,000).
    assert [(row.maximum, row.overage) for row in rows] == [(5000, 0), (1200, 300)]


def test_a_limit_deleted_and_defined_again_keeps_its_old_windows_definition(
    meter: Meter, clock: FrozenClock
) -> None:
    consume(meter, clock, "2026-11-10T10:00", "org-1", 1500)
    clock.set(at("2026-12-03T09:00"))
    meter.delete_limit("calls")
    assert overage_report(meter, period="2026-11") == []  # a deleted limit is left out
    redefine(meter, clock, "2026-12-05T09:00", calls(3000, "hard"))
    assert [figures(row) for row in november(meter)] == [("soft", 1000, 1500, 500)]


def test_a_late_event_before_the_first_definition_takes_the_first(
    db_url: str, clock: FrozenClock
) -> None:
    clock.set(at("2026-12-03T09:00"))
    with Meter(db_url, clock=clock) as meter:
        late = Limit(
            "late", maximum=10, period="1d", window="calendar", enforcement="soft", lateness="30d"
        )
        meter.set_limit(late)
        meter.consume("org-1", "late", cost=15, occurred_at=at("2026-11-29T10:00"))
        clock.set(at("2026-12-04T09:00"))
        meter.set_limit(dataclasses.replace(late, maximum=20))
        [row] = overage_report(meter, period="2026-11", limit="late")
        assert (row.maximum, row.overage) == (10, 5)


def test_a_shadow_limit_made_hard_still_reports_its_shadow_windows(
    meter: Meter, clock: FrozenClock
) -> None:
    redefine(meter, clock, "2026-10-01T09:00", calls(1000, "shadow"))
    consume(meter, clock, "2026-11-10T10:00", "org-1", 900)
    consume(meter, clock, "2026-11-11T10:00", "org-1", 200)  # would be denied
    redefine(meter, clock, "2026-12-03T09:00", calls(1000, "hard"))
    consume(meter, clock, "2026-12-10T10:00", "org-1", 900)
    consume(meter, clock, "2026-12-11T10:00", "org-1", 200)  # denied
    [row] = shadow_report(meter, "calls", period="2026-11")
    assert (row.subject, row.would_deny_cost, row.peak_maximum) == ("org-1", 200, 1000)
    assert shadow_report(meter, "calls", period="2026-12") == []  # hard by then: not shadow
    assert [figures(row) for row in november(meter)] == [("shadow", 1000, 900, 0)]
