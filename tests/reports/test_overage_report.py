"""`metering.reports` on SQLite and PostgreSQL, against an independent computation.

The data goes through `Meter.consume` (see `report_dataset`); expected
figures come from `report_dataset.expected_rows`, which shares no code with
the reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, date, datetime

import pytest
from report_dataset import Expected, at, by_overage, expected_rows, in_range

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidInput, UnknownLimit
from metering.reports import (
    COLUMNS,
    ReportRange,
    ReportRow,
    overage_report,
    select_overage,
    select_usage,
    usage_report,
)

NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
OCT = datetime(2026, 10, 1, tzinfo=UTC)


def tuples(rows: list[ReportRow]) -> list[tuple[object, ...]]:
    return [dataclasses.astuple(row) for row in rows]


def test_overage_for_a_month_equals_the_independent_computation(ledger: Meter) -> None:
    rows = overage_report(ledger, period="2026-11")
    assert tuples(rows) == by_overage(in_range(expected_rows(), NOV, DEC))
    # The dataset covers what the figures must get right: soft overage, hard
    # denials in calendar and first-use windows, and rows without any; only
    # soft usage is ever overage, denials never are.
    kinds = {(r.enforcement, r.overage > 0, r.denied > 0) for r in rows}
    assert kinds == {
        ("soft", True, False),
        ("soft", False, False),
        ("hard", False, True),
        ("hard", False, False),
    }


def test_soft_overage_is_usage_beyond_the_maximum(ledger: Meter) -> None:
    [row] = overage_report(ledger, period="2026-11", subject="org-a", limit="api_calls")
    calls = 15  # every other day from Oct 20, 2 each: Nov 1, 3, ..., 29
    assert (row.maximum, row.used, row.overage) == (10, 2 * calls, 2 * calls - 10)
    assert (row.denied_events, row.denied, row.first_denied_at) == (0, 0, None)
    assert row.utilisation_percent == 300.0


def test_a_hard_limits_denials_are_denied_never_overage(ledger: Meter) -> None:
    """Denied demand consumed nothing: it is ``denied``, and billable overage is 0."""
    [row] = overage_report(ledger, period="2026-11", subject="org-a", limit="seats")
    assert (row.maximum, row.used, row.denied_events, row.denied) == (5, 5, 2, 2)
    assert row.overage == 0
    assert row.first_denied_at == at("2026-11-15", 7)  # the 6th seat
    assert row.utilisation_percent == 100.0


def test_first_use_windows_of_a_month(ledger: Meter) -> None:
    rows = overage_report(ledger, period="2026-11", subject="org-a", limit="exports")
    by_start = {r.window_start: r for r in rows}
    assert sorted(by_start) == [at("2026-11-10", 11), at("2026-11-20", 9)]
    opened = by_start[at("2026-11-10", 11)]
    assert opened.window_end == at("2026-11-17", 11)
    assert (opened.used, opened.denied_events, opened.denied) == (2 + 1, 2, 1 + 3)
    assert opened.overage == 0
    assert opened.first_denied_at == at("2026-11-12", 11)


def test_a_window_without_denials_and_a_subject_without_any(ledger: Meter) -> None:
    rows = overage_report(ledger, period="2026-11")
    [quiet] = [r for r in rows if (r.subject, r.limit) == ("org-b", "exports")]
    assert (quiet.used, quiet.overage, quiet.denied_events, quiet.first_denied_at) == (
        2,
        0,
        0,
        None,
    )
    [org_c] = [r for r in rows if r.subject == "org-c"]
    assert (org_c.limit, org_c.used, org_c.overage, org_c.denied_events) == ("seats", 4, 0, 0)
    assert org_c.utilisation_percent == 80.0
    assert rows.index(org_c) > max(i for i, r in enumerate(rows) if r.overage or r.denied)


def test_a_period_selects_the_windows_that_start_in_it(ledger: Meter) -> None:
    """The first-use window opened on Oct 30 runs to Nov 6: October bills it, November not."""
    october = overage_report(ledger, period="2026-10", subject="org-a", limit="exports")
    november = overage_report(ledger, period="2026-11", subject="org-a", limit="exports")
    assert [(r.window_start, r.window_end) for r in october] == [
        (at("2026-10-30", 10), at("2026-11-06", 10))
    ]
    assert october[0].denied == 2  # the denial of Nov 4 counts in October
    assert at("2026-10-30", 10) not in {r.window_start for r in november}
    everything = expected_rows()
    for period, since, until in (("2026-10", OCT, NOV), ("2026-12", DEC, at("2027-01-01", 0))):
        assert tuples(overage_report(ledger, period=period)) == by_overage(
            in_range(everything, since, until)
        )


def test_since_and_until_select_window_starts_until_exclusive(ledger: Meter) -> None:
    since, until = at("2026-11-10", 0), at("2026-11-20", 9)  # excludes the window of Nov 20 9:00
    rows = overage_report(ledger, since=since, until=until)
    assert tuples(rows) == by_overage(in_range(expected_rows(), since, until))
    assert tuples(overage_report(ledger, since="2026-11-10", until="2026-11-20T09:00:00Z")) == (
        tuples(rows)
    )
    only_since = overage_report(ledger, since=date(2026, 12, 1))
    assert tuples(only_since) == by_overage(in_range(expected_rows(), DEC, at("2100-01-01")))
    only_until = overage_report(ledger, until="2026-11-01")
    assert tuples(only_until) == by_overage(in_range(expected_rows(), at("1970-01-01"), NOV))


def test_all_time_has_every_window_of_every_kept_limit(ledger: Meter) -> None:
    assert tuples(overage_report(ledger)) == by_overage(expected_rows())


def test_subject_limit_and_top_filters(ledger: Meter) -> None:
    november = by_overage(in_range(expected_rows(), NOV, DEC))
    assert tuples(overage_report(ledger, period="2026-11", subject="org-b")) == [
        row for row in november if row[0] == "org-b"
    ]
    assert tuples(overage_report(ledger, period="2026-11", limit="seats")) == [
        row for row in november if row[1] == "seats"
    ]
    assert tuples(overage_report(ledger, period="2026-11", top=3)) == november[:3]
    assert tuples(overage_report(ledger, period="2026-11", top=1000)) == november
    assert overage_report(ledger, period="2026-11", subject="nobody") == []


def test_token_buckets_and_deleted_limits_are_left_out(ledger: Meter) -> None:
    limits = {counter.limit for counter in ledger.counters(subject="org-a")}
    assert {"burst", "gone"} <= limits  # their counters exist ...
    reported = {row.limit for row in overage_report(ledger)}
    assert reported == {"api_calls", "exports", "seats"}  # ... but are not reported
    with pytest.raises(UnknownLimit):
        overage_report(ledger, limit="gone")
    assert overage_report(ledger, limit="burst") == []  # defined, but a bucket: no rows


def test_a_changed_limit_keeps_its_past_windows_maximum(ledger: Meter) -> None:
    ledger.set_limit(  # on Dec 5: November is over, December's window open
        Limit("api_calls", maximum=25, period="1mo", window="calendar", enforcement="soft")
    )
    [row] = overage_report(ledger, period="2026-11", subject="org-a", limit="api_calls")
    assert (row.maximum, row.used, row.overage, row.utilisation_percent) == (10, 30, 20, 300.0)
    [row] = overage_report(ledger, period="2026-12", subject="org-a", limit="api_calls")
    assert (row.maximum, row.used, row.overage, row.utilisation_percent) == (25, 6, 0, 24.0)


def test_usage_report_is_a_subjects_windows_over_time(ledger: Meter) -> None:
    def expected(rows: list[Expected]) -> list[tuple[object, ...]]:
        mine = [r for r in rows if r.subject == "org-a"]
        return [r.as_tuple() for r in sorted(mine, key=lambda r: (r.limit, r.window_start))]

    assert tuples(usage_report(ledger, "org-a")) == expected(expected_rows())
    assert tuples(usage_report(ledger, "org-a", period="2026-11")) == expected(
        in_range(expected_rows(), NOV, DEC)
    )
    calls = usage_report(ledger, "org-a", limit="api_calls")
    assert [r.window_start for r in calls] == [OCT, NOV, DEC]
    assert usage_report(ledger, "org-c", limit="api_calls") == []


def test_rows_stream_and_count(ledger: Meter) -> None:
    report = select_overage(ledger, period="2026-11", top=4)
    rows = report.rows()
    assert isinstance(rows, Iterator)
    assert len(list(rows)) == report.count() == 4
    usage = select_usage(ledger, "org-a")
    assert usage.count() == len(list(usage.rows())) == len(usage_report(ledger, "org-a"))
    assert report.range.label == "2026-11"


def test_row_fields_are_the_documented_columns() -> None:
    assert COLUMNS == (
        "subject",
        "limit",
        "enforcement",
        "window_start",
        "window_end",
        "maximum",
        "used",
        "granted",
        "overage",
        "overdraft",
        "denied",
        "denied_events",
        "utilisation_percent",
        "first_denied_at",
        "time_zone",
        "local_window",
    )


# -- bad filters -----------------------------------------------------------------


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOV)) as meter:
        meter.set_limit(Limit("api_calls", maximum=10, period="1mo", window="calendar"))
        yield meter


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"period": "2026-13"}, "period"),
        ({"period": "2026-1"}, "period"),
        ({"period": "november"}, "period"),
        ({"period": "2026-11", "since": "2026-11-01"}, "period"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-11-31"}, "until"),
        ({"since": "2026-12-01", "until": "2026-11-01"}, "since"),
        ({"since": "2026-11-01", "until": "2026-11-01"}, "since"),
        ({"top": 0}, "top"),
        ({"top": -3}, "top"),
        ({"subject": ""}, "subject"),
        ({"limit": "Not A Name"}, "name"),
    ],
)
def test_bad_filters_raise_invalid_input(
    meter: Meter, filters: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        select_overage(meter, **filters)  # type: ignore[arg-type]
    assert raised.value.field == field


def test_an_unknown_limit_raises_unknown_limit(meter: Meter) -> None:
    with pytest.raises(UnknownLimit) as raised:
        select_overage(meter, limit="nope")
    assert raised.value.limit == "nope"
    with pytest.raises(UnknownLimit):
        select_usage(meter, "org-a", limit="nope")
    with pytest.raises(InvalidInput):
        select_usage(meter, " padded ")


def test_report_range_months_and_labels() -> None:
    december = ReportRange.month("2026-12")
    assert (december.since, december.until) == (DEC, at("2027-01-01", 0))
    assert (
        ReportRange.of(since="2026-11-01", until="2026-11-16").label == "2026-11-01 to 2026-11-15"
    )
    assert ReportRange.of(since="2026-11-01T10:00:00+02:00").since == at("2026-11-01", 8)
    assert ReportRange.of().label == "all time"


def test_a_zoned_subjects_windows_carry_their_local_label(db_url: str) -> None:
    clock = FrozenClock(datetime(2026, 9, 15, tzinfo=UTC))
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(
            Limit("calls", maximum=5, period="1mo", window="calendar", enforcement="soft")
        )
        meter.set_time_zone("org-in", "Asia/Kolkata")  # from October on
        for moment, cost in [
            (datetime(2026, 9, 30, 20, tzinfo=UTC), 7),
            (datetime(2026, 10, 20, tzinfo=UTC), 1),
            (datetime(2026, 10, 31, 19, tzinfo=UTC), 7),
        ]:
            clock.set(moment)
            meter.consume("org-in", "calls", cost)
            meter.consume("org-utc", "calls", 1)
        rows = usage_report(meter, "org-in")
        labels = [(r.window_start, r.time_zone, r.local_window, r.overage) for r in rows]
        assert labels == [
            (datetime(2026, 9, 1, tzinfo=UTC), None, None, 2),
            (
                datetime(2026, 10, 1, tzinfo=UTC),  # the transition: UTC's end to Kolkata's
                "Asia/Kolkata",
                "2026-10-01 05:30:00+05:30 to 2026-11-01 00:00:00+05:30 Asia/Kolkata",
                0,
            ),
            (datetime(2026, 10, 31, 18, 30, tzinfo=UTC), "Asia/Kolkata", "2026-11 Asia/Kolkata", 2),
        ]
        assert {r.local_window for r in usage_report(meter, "org-utc")} == {None}
        assert "local_window" in COLUMNS


def test_a_billing_month_selects_each_subjects_local_month(db_url: str) -> None:
    # Zones set in September: October's windows on are local. Kolkata's and
    # Kathmandu's Novembers start on 31 October in UTC, Santiago's on 1 November
    # at 03:00 UTC, Berlin's on 31 October at 23:00 UTC; each is November's.
    clock = FrozenClock(datetime(2026, 9, 15, tzinfo=UTC))
    zones = {
        "org-in": "Asia/Kolkata",
        "org-np": "Asia/Kathmandu",
        "org-cl": "America/Santiago",
        "org-de": "Europe/Berlin",
    }
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=5, period="1mo", window="calendar", enforcement="soft"),
                Limit("daily", maximum=5, period="1d", window="calendar", enforcement="soft"),
                Limit("hourly", maximum=5, period="1h", window="calendar", enforcement="soft"),
            ]
        )
        for subject, zone in zones.items():
            meter.set_time_zone(subject, zone)
        clock.set(datetime(2026, 11, 1, 3, 30, tzinfo=UTC))  # November everywhere
        for subject in [*zones, "org-utc"]:
            for limit in ("calls", "daily", "hourly"):
                meter.consume(subject, limit, 7)
        november = overage_report(meter, period="2026-11")
        starts = {(r.subject, r.limit): r.window_start for r in november}
        assert starts[("org-in", "calls")] == datetime(2026, 10, 31, 18, 30, tzinfo=UTC)
        assert starts[("org-np", "calls")] == datetime(2026, 10, 31, 18, 15, tzinfo=UTC)
        assert starts[("org-cl", "calls")] == datetime(2026, 11, 1, 3, tzinfo=UTC)
        assert starts[("org-de", "calls")] == datetime(2026, 10, 31, 23, tzinfo=UTC)
        assert starts[("org-utc", "calls")] == NOV
        # Every window of the five subjects is November's (an hour too: 03:00 UTC
        # is in November in each zone), none October's.
        assert len(november) == 15 and select_overage(meter, period="2026-11").count() == 15
        assert {r.overage for r in november} == {2}
        assert overage_report(meter, period="2026-10") == []
        assert len(usage_report(meter, "org-in", period="2026-11")) == 3
        # An explicit range still selects by the UTC start.
        october_utc = overage_report(meter, since=OCT, until=NOV)
        assert {r.subject for r in october_utc} == {"org-in", "org-np", "org-de"}
        # Santiago's hour at 03:00 UTC is 00:00 local, 1 November; at 02:00 UTC,
        # 23:00 on 31 October: October's.
        clock.set(datetime(2026, 11, 1, 2, 30, tzinfo=UTC))
        meter.consume("org-cl", "hourly", 1)
        [october] = overage_report(meter, period="2026-10")
        assert (october.subject, october.window_start) == (
            "org-cl",
            datetime(2026, 11, 1, 2, tzinfo=UTC),
        )
