"""The report queries (`metering/storage/reports.py`) on both databases: the
maximum that applied to a window (the entitlement in force at its last
instant, else the limit's), overage only of soft limits and beyond what
grants paid, overdraft billed no further than the usage past that maximum, no
token buckets nor deleted limits, the order, filters, counts and ``top``; the
shadow report's row per subject at its peak window."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import to_us
from metering.storage.reports import (
    LimitKind,
    ReportQuery,
    ReportStore,
    count_statement,
    overage_statement,
    shadow_count_statement,
    shadow_statement,
    usage_statement,
)
from metering.storage.tables import counters, overdrafts

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
H12, H13 = to_us(NOW), to_us(NOW + timedelta(hours=1))


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("hard", maximum=5, period="1h", window="calendar"),
                Limit("soft", maximum=5, period="1h", window="calendar", enforcement="soft"),
                Limit("bucket", maximum=5, period="1h", algorithm="token_bucket"),
                Limit("gone", maximum=5, period="1h", window="calendar"),
                Limit("shadow", maximum=2, period="1h", window="calendar", enforcement="shadow"),
            ]
        )
        yield meter


def _rows(meter: Meter, statement: Any) -> list[dict[str, Any]]:
    def work(connection: Any) -> list[dict[str, Any]]:
        return [dict(row._mapping) for row in ReportStore(connection).stream(statement)]

    return meter.database.run(work)


def _count(meter: Meter, statement: Any, top: int | None = None) -> int:
    return meter.database.run(lambda connection: ReportStore(connection).count(statement, top))


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["subject"], row["limit_name"], row["window_start_us"])


def test_overage_is_a_soft_limits_own_usage_beyond_the_maximum(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("a", "soft", 8)
    meter.consume("a", "hard", 4)
    meter.consume("a", "hard", 4)  # denied: denied cost is never overage
    meter.consume("a", "bucket", 1)
    meter.consume("a", "gone", 1)
    meter.grant("b", "soft", 4)
    meter.consume("b", "soft", 8)  # grants pay 3 past the maximum
    meter.delete_limit("gone")
    rows = _rows(meter, overage_statement(ReportQuery()))
    found = [(*_key(r)[:2], r["used"], r["granted"], r["overage"], r["denied_cost"]) for r in rows]
    assert found == [
        ("a", "soft", 8, 0, 3, 0),  # by overage, then denied cost, utilisation, key
        ("a", "hard", 4, 0, 0, 4),
        ("b", "soft", 8, 3, 0, 0),
    ]
    assert _count(meter, count_statement(ReportQuery())) == 3
    assert _count(meter, count_statement(ReportQuery()), top=2) == 2
    top = _rows(meter, overage_statement(ReportQuery(top=1)))
    assert [_key(r)[:2] for r in top] == [("a", "soft")]


def _billed(enforcement: str, used: int, granted: int, maximum: int, recorded: int) -> int:
    """The rule: overdraft billed is the recorded one, but never more than the
    window's own usage past the maximum shown that overage does not bill."""
    past = max(used - granted - maximum, 0)
    overage = past if enforcement == "soft" else 0
    return min(recorded, past - overage)


def test_overdraft_is_billed_no_further_than_the_usage_past_the_maximum_shown(
    meter: Meter,
) -> None:
    """Windows of every kind with an overdraft recorded against another
    maximum than the one shown (an entitlement set or removed since, a limit
    made soft, a void): the rows bill min(recorded, past - overage)."""
    grid = [
        (limit, used, granted, recorded)
        for limit in ("hard", "soft", "shadow")
        for used in (0, 4, 5, 7, 12)
        for granted in (0, 3)
        for recorded in (0, 1, 2, 9)
        if granted <= used
    ]
    windows, overdrawn = [], []
    for n, (limit, used, granted, recorded) in enumerate(grid):
        window = {"limit_name": limit, "subject": f"s{n}", "window_start_us": H12}
        windows.append(
            {
                **window,
                "window_end_us": H13,
                "used": used,
                "granted": granted,
                "denied_count": 0,
                "denied_cost": 0,
                "tat_rem": 0,
                "tat_scale": 1,
                "updated_at_us": H12,
            }
        )
        # Two commits' overdrafts: the window's is their sum.
        for part, units in enumerate((recorded // 2, recorded - recorded // 2)):
            if units:
                overdrawn.append(
                    {**window, "event_id": f"e{n}.{part}", "units": units, "created_at_us": H12}
                )

    def write(connection: Any) -> None:
        connection.execute(insert(counters), windows)
        connection.execute(insert(overdrafts), overdrawn)

    meter.database.run(write)
    rows = {r["subject"]: r for r in _rows(meter, overage_statement(ReportQuery()))}
    for n, (limit, used, granted, recorded) in enumerate(grid):
        row = rows[f"s{n}"]
        maximum = row["maximum"]
        assert row["overdraft"] == _billed(row["enforcement"], used, granted, maximum, recorded), (
            limit,
            used,
            granted,
            recorded,
        )
        assert row["overage"] + row["overdraft"] <= max(used - granted - maximum, 0)
    # Ordered by the overdraft billed, after overage: hard rows by it, descending.
    hard = [r["overdraft"] for r in rows.values() if r["limit_name"] == "hard"]
    assert hard == sorted(hard, reverse=True)


def test_the_maximum_that_applied_is_the_entitlement_in_force_at_the_windows_end(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_entitlement("a", "hard", 9, effective_from=NOW + timedelta(minutes=30))
    meter.set_entitlement("a", "hard", None, effective_from=NOW + timedelta(hours=1, minutes=59))
    meter.consume("a", "hard", 1)
    meter.consume("b", "hard", 1)
    clock.set(NOW + timedelta(hours=1))
    meter.consume("a", "hard", 1)
    clock.set(NOW + timedelta(hours=2))
    meter.consume("a", "hard", 1)
    rows = _rows(meter, usage_statement(ReportQuery(subject="a")))
    assert [(r["window_start_us"], r["maximum"]) for r in rows] == [
        (H12, 9),  # in force from 12:30 to the window's end
        (H13, 5),  # back to the default at 13:59, before the end
        (H13 + (H13 - H12), 5),
    ]
    [other] = _rows(meter, usage_statement(ReportQuery(subject="b")))
    assert other["maximum"] == 5


def test_rows_are_filtered_by_period_subject_and_limit(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("a", "hard", 1)
    meter.consume("b", "soft", 1)
    clock.set(NOW + timedelta(hours=1))
    meter.consume("a", "hard", 2)
    everything = ReportQuery()
    assert len(_rows(meter, overage_statement(everything))) == 3
    later = _rows(meter, overage_statement(ReportQuery(since_us=H13)))
    assert [_key(r) for r in later] == [("a", "hard", H13)]
    earlier = ReportQuery(until_us=H13, limit="hard")
    assert [_key(r) for r in _rows(meter, overage_statement(earlier))] == [("a", "hard", H12)]
    usage = _rows(meter, usage_statement(ReportQuery(subject="a")))
    assert [r["window_start_us"] for r in usage] == [H12, H13]  # time order
    assert _count(meter, count_statement(ReportQuery(subject="b"))) == 1


def test_the_shadow_report_has_a_row_per_subject_at_its_peak(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("a", "shadow", 3)  # would deny 3
    clock.set(NOW + timedelta(hours=1))
    meter.consume("a", "shadow", 4)  # would deny 4: the peak
    meter.consume("a", "shadow", 1)  # fits: a would-deny counts as a hard denial would
    meter.consume("b", "shadow", 3)
    meter.consume("c", "shadow", 1)  # never over: no row
    query = ReportQuery(limit="shadow")
    rows = _rows(meter, shadow_statement(query))
    found = [
        (r["subject"], r["events"], r["cost"], r["windows"], r["window_start_us"], [*r.values()][9])
        for r in rows
    ]  # the tenth column: the maximum that applied
    assert found == [("a", 2, 7, 2, H13, 2), ("b", 1, 3, 1, H13, 2)]
    assert _count(meter, shadow_count_statement(query)) == 2
    assert len(_rows(meter, shadow_statement(ReportQuery(limit="shadow", top=1)))) == 1


def test_a_limit_is_known_with_its_kind(meter: Meter) -> None:
    def kinds(connection: Any) -> tuple[Any, ...]:
        store = ReportStore(connection)
        return store.limit_kind("soft"), store.limit_kind("nope"), store.limit_exists("bucket")

    assert meter.database.run(kinds) == (LimitKind("soft", "fixed_window"), None, True)
