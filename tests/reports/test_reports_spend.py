"""The spend report (`metering/reports/spend.py`), on both databases: per
subject and currency, the amount of each priced limit and the total, one row
per spend limit of the currency with its cap (the entitlement in force at
the period's end, or now), none without one; a month or all time; JSON in
major units, CSV with a column per priced limit and formulas neutralised."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.errors import InvalidInput
from metering.reports import overage_report
from metering.reports.spend import spend_report

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10**6, period="1mo", window="calendar"))
        meter.set_limit(Limit("tokens", maximum=10**6, period="1mo", window="calendar"))
        meter.set_limit(Limit("free", maximum=10**6, period="1mo", window="calendar"))
        meter.set_limit(spend_limit("spend", "5", "USD", "1mo", window="calendar"))
        meter.set_price("calls", "0.01", "USD")
        meter.set_price("tokens", "0.001", "EUR")
        yield meter


def test_a_subjects_spend_per_currency_with_each_priced_limit(meter: Meter) -> None:
    meter.consume(charges=[("org-1", "calls", 12), ("org-1", "tokens", 2500)])
    meter.consume(charges=[("org-1", "calls", 3), ("org-1", "free", 40)])
    meter.consume("org-2", "tokens", 1000)
    rows = spend_report(meter, "2026-11").rows
    found = sorted((r.subject, r.currency, r.amounts, r.total, r.spend_limit, r.cap) for r in rows)
    assert found == [
        ("org-1", "EUR", {"tokens": 250}, 250, None, None),  # no spend limit in EUR
        ("org-1", "USD", {"calls": 15}, 15, "spend", 500),
        ("org-2", "EUR", {"tokens": 100}, 100, None, None),
    ]
    [only] = spend_report(meter, "2026-11", subject="org-2").rows
    assert only.subject == "org-2"
    assert spend_report(meter, "2026-10").rows == []


def test_each_spend_limit_of_the_currency_is_a_row_with_its_own_cap(meter: Meter) -> None:
    meter.set_limit(spend_limit("daily", "1", "USD", "1d", window="calendar"))
    meter.set_entitlement("org-1", "daily", 200)
    meter.consume("org-1", "calls", 7)
    rows = spend_report(meter, "2026-11").rows
    assert sorted((r.spend_limit, r.cap, r.total) for r in rows) == [
        ("daily", 200, 7),
        ("spend", 500, 7),
    ]


def test_a_past_months_cap_is_the_default_at_its_end(db_url: str) -> None:
    clock = FrozenClock(NOW)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=10**6, period="1mo", window="calendar"))
        meter.set_limit(spend_limit("spend", "5", "USD", "1mo", window="calendar"))
        meter.set_price("calls", "0.01", "USD")
        meter.consume("org-1", "calls", 7)
        clock.set(datetime(2026, 12, 3, tzinfo=UTC))
        meter.set_limit(spend_limit("spend", "9", "USD", "1mo", window="calendar"))
        [row] = spend_report(meter, "2026-11").rows
        assert (row.spend_limit, row.cap, row.total) == ("spend", 500, 7)


def test_json_shows_money_in_major_units_and_csv_a_column_per_priced_limit(
    meter: Meter,
) -> None:
    meter.consume(charges=[("=cmd", "calls", 150), ("=cmd", "tokens", 20)])
    report = spend_report(meter, "2026-11")
    assert report.limits == ["calls", "tokens"]
    assert report.to_dict()["report"] == "spend"
    assert report.to_dict()["period"] == report.range.label
    usd = next(r for r in report.to_dict()["rows"] if r["currency"] == "USD")
    assert usd == {
        "subject": "=cmd",
        "currency": "USD",
        "amounts": {"calls": "1.50"},
        "total": "1.50",
        "spend_limit": "spend",
        "cap": "5.00",
        "time_zone": None,
        "local_window": None,
    }
    assert report.csv_header() == [
        "subject",
        "currency",
        "total",
        "spend_limit",
        "cap",
        "time_zone",
        "local_window",
        "amount:calls",
        "amount:tokens",
    ]
    assert sorted(report.csv_rows()) == [
        ["'=cmd", "EUR", "0.02", "", "", "", "", "", "0.02"],
        ["'=cmd", "USD", "1.50", "spend", "5.00", "", "", "1.50", ""],
    ]


@pytest.mark.parametrize(("period", "subject"), [("2026-13", None), ("2026-11", " org")])
def test_a_bad_period_or_subject_is_refused(meter: Meter, period: str, subject: str) -> None:
    with pytest.raises(InvalidInput):
        spend_report(meter, period, subject)


def test_without_a_period_the_spend_report_covers_all_time(db_url: str) -> None:
    clock = FrozenClock(datetime(2026, 10, 20, tzinfo=UTC))
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=1000, period="1mo", window="calendar"))
        meter.set_limit(spend_limit("spend", "0.50", "USD", "1mo", window="calendar"))
        meter.set_price("calls", "0.01", "USD")
        assert meter.consume("org-1", "calls", 10).allowed
        clock.set(NOW)
        meter.set_entitlement("org-1", "spend", 80)
        assert meter.consume("org-1", "calls", 5).allowed
        report = spend_report(meter)
        assert report.range.label == "all time"
        [row] = report.rows
        assert (row.amounts, row.total, row.cap) == ({"calls": 15}, 15, 80)  # the cap now
        [october] = spend_report(meter, "2026-10").rows
        assert (october.total, october.cap) == (10, 50)


def test_a_billing_month_is_the_subjects_local_month(db_url: str) -> None:
    clock = FrozenClock(datetime(2026, 9, 1, tzinfo=UTC))
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=1000, period="1mo", window="calendar"))
        meter.set_limit(spend_limit("spend", "0.50", "USD", "1mo", window="calendar"))
        meter.set_price("calls", "0.01", "USD")
        meter.set_time_zone("org-in", "Asia/Kolkata")
        meter.set_time_zone("org-np", "Asia/Kathmandu")
        # 31 October at 19:00 UTC is November in Kolkata and Kathmandu, October in UTC.
        clock.set(datetime(2026, 10, 31, 19, 0, tzinfo=UTC))
        for subject in ("org-in", "org-np", "org-utc"):
            meter.consume(subject, "calls", 3)
        # Kathmandu's November starts at 18:15 UTC: the hour from 18:00 is October's.
        clock.set(datetime(2026, 10, 31, 18, 20, tzinfo=UTC))
        meter.consume("org-np", "calls", 1)
        november = {r.subject: r for r in spend_report(meter, "2026-11").rows}
        october = {r.subject: r for r in spend_report(meter, "2026-10").rows}
        assert {s: r.total for s, r in november.items()} == {"org-in": 3, "org-np": 3}
        assert {s: r.total for s, r in october.items()} == {"org-np": 1, "org-utc": 3}
        labels = (november["org-in"].time_zone, november["org-in"].local_window)
        assert labels == ("Asia/Kolkata", "2026-11 Asia/Kolkata")
        assert november["org-in"].to_dict()["local_window"] == "2026-11 Asia/Kolkata"
        assert (october["org-utc"].time_zone, october["org-utc"].local_window) == (None, None)
        assert spend_report(meter, "2026-11", "org-in").rows[0].total == 3
        report = spend_report(meter, "2026-11")
        assert report.csv_header()[5:7] == ["time_zone", "local_window"]


def test_a_change_of_zone_bills_each_hour_in_exactly_one_month(db_url: str) -> None:
    """The windows between two zones are billed in their billing month: none
    of their money is left out of every month, nor counted in two."""
    clock = FrozenClock(datetime(2026, 9, 1, tzinfo=UTC))
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=1000, period="1mo", window="calendar"))
        meter.set_price("calls", "0.01", "USD")
        meter.set_time_zone("org-in", "Asia/Kolkata")  # to UTC in November, below
        meter.set_time_zone("org-ny", "America/New_York")  # to UTC in November, below
        clock.set(datetime(2026, 11, 10, tzinfo=UTC))
        meter.set_time_zone("org-in", "UTC")
        meter.set_time_zone("org-ny", "UTC")
        # Kolkata's November ends at 18:30 UTC on the 30th, then UTC's window until
        # midnight: a window starting in November, billed in November.
        clock.set(datetime(2026, 11, 30, 20, tzinfo=UTC))
        meter.consume("org-in", "calls", 3)
        # New York's November runs until 05:00 UTC on 1 December: November's.
        clock.set(datetime(2026, 12, 1, 3, tzinfo=UTC))
        meter.consume("org-ny", "calls", 4)
        clock.set(datetime(2026, 12, 2, tzinfo=UTC))
        meter.consume("org-ny", "calls", 5)
        months = {
            p: {r.subject: r.total for r in spend_report(meter, p).rows}
            for p in ("2026-11", "2026-12")
        }
        assert months == {"2026-11": {"org-in": 3, "org-ny": 4}, "2026-12": {"org-ny": 5}}
        # The overage report bills the same windows in the same months.
        windows = {
            p: sorted((r.subject, r.used) for r in overage_report(meter, period=p))
            for p in ("2026-11", "2026-12")
        }
        assert windows == {"2026-11": [("org-in", 3), ("org-ny", 4)], "2026-12": [("org-ny", 5)]}
