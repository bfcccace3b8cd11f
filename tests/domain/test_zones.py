"""Calendar windows at a subject's local midnight (`metering.domain.zones`).

Across the DST changes of Europe/Berlin (a 23-hour and a 25-hour day),
America/Santiago (whose clocks change at midnight: a skipped midnight, a day
that repeats its last hour) and Asia/Kathmandu (+05:45, no DST); for days,
weeks and months; and what a change of zone does to the windows around it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from metering.domain.instants import from_us, to_us
from metering.domain.limits import parse_period
from metering.domain.windows import calendar_window
from metering.domain.zones import (
    billing_month,
    follows_zone,
    local_midnight,
    local_span,
    local_text,
    month_bounds,
    validate_zone,
    window_label,
    window_zone,
    zone_before,
    zoned_window,
)
from metering.errors import InvalidInput

HOUR_US = 3_600_000_000


def at(*parts: int) -> int:
    return to_us(datetime(*parts, tzinfo=UTC))  # type: ignore[misc]


def window(period: str, zone: str, moment: int) -> tuple[int, int]:
    return calendar_window(parse_period(period), moment, ((0, zone),))


@pytest.mark.parametrize(
    ("zone", "moment", "start", "end", "hours"),
    [
        # Berlin springs forward on 2026-03-29: 23 hours, from 23:00Z to 22:00Z.
        ("Europe/Berlin", at(2026, 3, 29, 12), at(2026, 3, 28, 23), at(2026, 3, 29, 22), 23),
        # ... and falls back on 2026-10-25: 25 hours, from 22:00Z to 23:00Z.
        ("Europe/Berlin", at(2026, 10, 25, 12), at(2026, 10, 24, 22), at(2026, 10, 25, 23), 25),
        # Santiago skips 2026-09-06 00:00: the day starts at 01:00 -03 (04:00Z).
        ("America/Santiago", at(2026, 9, 6, 12), at(2026, 9, 6, 4), at(2026, 9, 7, 3), 23),
        # ... and lives 23:00-24:00 of 2026-04-04 twice: a 25-hour day.
        ("America/Santiago", at(2026, 4, 4, 12), at(2026, 4, 4, 3), at(2026, 4, 5, 4), 25),
        ("America/Santiago", at(2026, 4, 5, 3, 30), at(2026, 4, 4, 3), at(2026, 4, 5, 4), 25),
        # Kathmandu is 5:45 ahead all year: days start at 18:15Z.
        (
            "Asia/Kathmandu",
            at(2026, 4, 5, 18, 14),
            at(2026, 4, 4, 18, 15),
            at(2026, 4, 5, 18, 15),
            24,
        ),
        (
            "Asia/Kathmandu",
            at(2026, 4, 5, 18, 15),
            at(2026, 4, 5, 18, 15),
            at(2026, 4, 6, 18, 15),
            24,
        ),
    ],
)
def test_a_day_starts_at_local_midnight(
    zone: str, moment: int, start: int, end: int, hours: int
) -> None:
    assert window("1d", zone, moment) == (start, end)
    assert end - start == hours * HOUR_US


def test_a_week_starts_on_a_local_monday_and_holds_the_change() -> None:
    # Monday 2026-03-23 00:00 CET to Monday 2026-03-30 00:00 CEST: 167 hours.
    start, end = window("7d", "Europe/Berlin", at(2026, 3, 29, 12))
    assert (start, end) == (at(2026, 3, 22, 23), at(2026, 3, 29, 22))
    assert local_text(start, "Europe/Berlin") == "2026-03-23 00:00:00+01:00"
    assert window("7d", "Europe/Berlin", at(2026, 10, 28))[0] == at(2026, 10, 25, 23)
    # Kathmandu: Monday 2026-04-06 00:00 +05:45.
    assert window("7d", "Asia/Kathmandu", at(2026, 4, 7)) == (
        at(2026, 4, 5, 18, 15),
        at(2026, 4, 12, 18, 15),
    )
    # Santiago, the week of the skipped midnight: Monday 2026-09-07 starts at 03:00Z.
    assert window("7d", "America/Santiago", at(2026, 9, 6, 12)) == (
        at(2026, 8, 31, 4),
        at(2026, 9, 7, 3),
    )


@pytest.mark.parametrize(
    ("zone", "moment", "start", "end"),
    [
        ("Europe/Berlin", at(2026, 3, 15), at(2026, 2, 28, 23), at(2026, 3, 31, 22)),
        ("Europe/Berlin", at(2026, 10, 31, 23, 30), at(2026, 10, 31, 23), at(2026, 11, 30, 23)),
        ("America/Santiago", at(2026, 4, 15), at(2026, 4, 1, 3), at(2026, 5, 1, 4)),
        ("America/Santiago", at(2026, 9, 15), at(2026, 9, 1, 4), at(2026, 10, 1, 3)),
        (
            "Asia/Kathmandu",
            at(2026, 4, 30, 18, 15),
            at(2026, 4, 30, 18, 15),
            at(2026, 5, 31, 18, 15),
        ),
    ],
)
def test_a_month_starts_at_local_midnight_of_its_first(
    zone: str, moment: int, start: int, end: int
) -> None:
    assert window("1mo", zone, moment) == (start, end)


def test_a_quarter_and_a_year_too() -> None:
    assert window("3mo", "Asia/Kathmandu", at(2026, 5, 5)) == (
        at(2026, 3, 31, 18, 15),
        at(2026, 6, 30, 18, 15),
    )
    assert window("1y", "Europe/Berlin", at(2026, 5, 5)) == (
        at(2025, 12, 31, 23),
        at(2026, 12, 31, 23),
    )


def test_periods_of_hours_stay_in_utc() -> None:
    assert not follows_zone(parse_period("1h")) and not follows_zone(parse_period("36h"))
    assert follows_zone(parse_period("2d")) and follows_zone(parse_period("1mo"))
    assert window("1h", "Asia/Kathmandu", at(2026, 4, 5, 18, 20)) == (
        at(2026, 4, 5, 18),
        at(2026, 4, 5, 19),
    )


def test_a_skipped_midnight_starts_at_the_first_instant_after_it() -> None:
    assert local_midnight(datetime(2026, 9, 6).date(), "America/Santiago") == at(2026, 9, 6, 4)
    assert local_text(at(2026, 9, 6, 4), "America/Santiago") == "2026-09-06 01:00:00-03:00"


def test_every_instant_is_in_its_window_around_the_changes() -> None:
    for zone in ("Europe/Berlin", "America/Santiago", "Asia/Kathmandu"):
        for start in (at(2026, 3, 27), at(2026, 4, 3), at(2026, 9, 4), at(2026, 10, 23)):
            edges = set()
            for quarter in range(4 * 24 * 4):
                moment = start + quarter * HOUR_US // 4
                low, high = window("1d", zone, moment)
                assert low <= moment < high
                edges.add((low, high))
            ordered = sorted(edges)
            assert all(a[1] == b[0] for a, b in pairwise(ordered))


NOVEMBER = at(2026, 11, 1)
CHANGED = at(2026, 11, 14, 10)


def test_a_change_takes_effect_where_the_current_window_ends() -> None:
    month = parse_period("1mo")
    history = ((CHANGED, "Asia/Kolkata"),)
    # The window the change falls in keeps its UTC bounds ...
    assert zoned_window(month, history, CHANGED) == (NOVEMBER, at(2026, 12, 1))
    assert zoned_window(month, history, at(2026, 11, 30, 20)) == (NOVEMBER, at(2026, 12, 1))
    # ... the next starts where it ends and ends at Kolkata's next month boundary ...
    assert zoned_window(month, history, at(2026, 12, 1)) == (
        at(2026, 12, 1),
        at(2026, 12, 31, 18, 30),
    )
    # ... and later ones follow Kolkata.
    assert zoned_window(month, history, at(2027, 1, 5)) == (
        at(2026, 12, 31, 18, 30),
        at(2027, 1, 31, 18, 30),
    )
    assert window_zone(month, history, at(2026, 11, 30)) == "UTC"
    assert window_zone(month, history, at(2026, 12, 1)) == "Asia/Kolkata"
    # Before the change, nothing moved.
    assert zoned_window(month, history, at(2026, 10, 31, 20)) == (at(2026, 10, 1), NOVEMBER)


def test_a_change_westward_gives_a_short_transition_window() -> None:
    day = parse_period("1d")
    history = ((at(2026, 11, 14, 10), "America/Santiago"),)  # -03:00 in November
    assert zoned_window(day, history, at(2026, 11, 14, 23)) == (at(2026, 11, 14), at(2026, 11, 15))
    assert zoned_window(day, history, at(2026, 11, 15, 1)) == (
        at(2026, 11, 15),
        at(2026, 11, 15, 3),
    )
    assert zoned_window(day, history, at(2026, 11, 15, 3)) == (
        at(2026, 11, 15, 3),
        at(2026, 11, 16, 3),
    )


def test_changes_before_the_first_takes_effect_replace_it() -> None:
    day = parse_period("1d")
    first, second = at(2026, 11, 14, 10), at(2026, 11, 14, 11)
    history = ((first, "America/Santiago"), (second, "Asia/Kathmandu"))
    assert zoned_window(day, history, at(2026, 11, 15, 1)) == (
        at(2026, 11, 15),
        at(2026, 11, 15, 18, 15),
    )
    back = ((first, "America/Santiago"), (second, "UTC"))
    assert zoned_window(day, back, at(2026, 11, 15, 1)) == (at(2026, 11, 15), at(2026, 11, 16))
    # A second change after the first took effect: from the end of its window.
    later = ((first, "America/Santiago"), (at(2026, 11, 20, 12), "UTC"))
    assert zoned_window(day, later, at(2026, 11, 21, 1)) == (
        at(2026, 11, 20, 3),
        at(2026, 11, 21, 3),
    )
    assert zoned_window(day, later, at(2026, 11, 21, 4)) == (at(2026, 11, 21, 3), at(2026, 11, 22))


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "europe/berlin", "../etc/passwd", 5, None])
def test_an_unknown_zone_is_invalid_input(name: object) -> None:
    with pytest.raises(InvalidInput, match="IANA time zone"):
        validate_zone(name)


def test_known_zones_are_accepted() -> None:
    for name in ("UTC", "Asia/Kolkata", "Asia/Kathmandu", "America/Santiago", "Europe/Berlin"):
        assert validate_zone(name) == name


HISTORIES = [
    ((CHANGED, "Asia/Kolkata"),),
    ((at(2026, 11, 14, 10), "America/Santiago"), (at(2026, 11, 14, 11), "Asia/Kathmandu")),
    ((at(2026, 11, 14, 10), "America/Santiago"), (at(2026, 11, 20, 12), "UTC")),
    ((at(2026, 3, 10), "Europe/Berlin"), (at(2026, 10, 25, 1), "America/Santiago")),
    ((at(2026, 11, 1), "Asia/Kathmandu"),),  # a change exactly at a window's start
]


@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("period", ["1d", "7d", "1mo"])
def test_a_windows_billing_month_is_its_start_in_the_zone_it_is_aligned_in(
    history: tuple[tuple[int, str], ...], period: str
) -> None:
    parsed = parse_period(period)
    moment, end = at(2026, 3, 1), at(2027, 2, 1)
    while moment < end:
        start, stop = zoned_window(parsed, history, moment)
        zone = window_zone(parsed, history, start)
        assert zone_before(history, start) == zone
        assert billing_month(history, start) == f"{from_us(start).astimezone(ZoneInfo(zone)):%Y-%m}"
        moment = stop


@pytest.mark.parametrize(
    "history",
    [
        *HISTORIES,
        ((at(2026, 9, 1), "Asia/Kolkata"), (CHANGED, "UTC")),
        ((at(2026, 9, 1), "America/New_York"), (CHANGED, "UTC")),
        ((at(2026, 9, 1), "Asia/Kolkata"), (CHANGED, "America/New_York")),
    ],
)
def test_billing_months_tile_time_as_the_windows_billing_months_say(
    history: tuple[tuple[int, str], ...],
) -> None:
    """Each instant is in one billing month: the one of the monthly window
    holding it, transitions between two zones included."""
    months = [(2026, m) for m in range(9, 13)] + [(2027, 1), (2027, 2)]
    bounds = [month_bounds(history, y, m)[:2] for y, m in months]
    assert all(a[1] == b[0] for a, b in pairwise(bounds))
    moment = bounds[0][0]
    while moment < bounds[-1][1]:
        start, stop = zoned_window(parse_period("1mo"), history, moment)
        y, m = (int(part) for part in billing_month(history, start).split("-"))
        low, high = bounds[months.index((y, m))]
        assert low <= start and stop <= high
        moment = stop


def test_a_billing_months_bounds_are_its_monthly_window() -> None:
    history = ((CHANGED, "Asia/Kolkata"),)
    assert month_bounds(history, 2026, 11) == (NOVEMBER, at(2026, 12, 1), "UTC")
    assert month_bounds(history, 2026, 12) == (
        at(2026, 12, 1),
        at(2026, 12, 31, 18, 30),
        "Asia/Kolkata",
    )
    assert month_bounds((), 2026, 2) == (at(2026, 2, 1), at(2026, 3, 1), "UTC")
    assert billing_month((), at(2026, 10, 31, 23)) == "2026-10"
    assert billing_month(history, at(2026, 12, 31, 18, 30)) == "2027-01"


def test_a_february_after_a_change_of_zone_is_billed_whole() -> None:
    history = ((at(2026, 1, 10), "Asia/Kolkata"),)  # in force from February on
    assert month_bounds(history, 2026, 1) == (at(2026, 1, 1), at(2026, 2, 1), "UTC")
    assert month_bounds(history, 2026, 2) == (
        at(2026, 2, 1),
        at(2026, 2, 28, 18, 30),
        "Asia/Kolkata",
    )


BERLIN = "Europe/Berlin"


@pytest.mark.parametrize(
    ("start", "end", "zone", "label"),
    [
        (*window("1mo", BERLIN, at(2026, 3, 15)), BERLIN, "2026-03 Europe/Berlin"),
        (*window("1d", BERLIN, at(2026, 3, 29, 12)), BERLIN, "2026-03-29 Europe/Berlin"),
        (
            *window("1d", "America/Santiago", at(2026, 9, 6, 12)),  # from 01:00, midnight skipped
            "America/Santiago",
            "2026-09-06 America/Santiago",
        ),
        (*window("7d", BERLIN, at(2026, 3, 25)), BERLIN, "2026-03-23 to 2026-03-29 Europe/Berlin"),
        (*window("3mo", BERLIN, at(2026, 2, 1)), BERLIN, "2026-01-01 to 2026-03-31 Europe/Berlin"),
        (*window("2mo", BERLIN, at(2026, 3, 5)), BERLIN, "2026-03-01 to 2026-04-30 Europe/Berlin"),
        # whole days, a month apart but not from a first to a first
        (
            at(2026, 1, 31, 23),
            at(2026, 3, 14, 23),
            BERLIN,
            "2026-02-01 to 2026-03-14 Europe/Berlin",
        ),
        (
            at(2026, 2, 14, 23),
            at(2026, 2, 28, 23),
            BERLIN,
            "2026-02-15 to 2026-02-28 Europe/Berlin",
        ),
        # not at local midnight (either end): both ends, rounded up to the second
        (
            at(2026, 3, 29, 12),
            at(2026, 3, 29, 13) + 1,
            BERLIN,
            "2026-03-29 14:00:00+02:00 to 2026-03-29 15:00:01+02:00 Europe/Berlin",
        ),
        (
            at(2026, 3, 28, 23),
            at(2026, 3, 29, 13),
            BERLIN,
            "2026-03-29 00:00:00+01:00 to 2026-03-29 15:00:00+02:00 Europe/Berlin",
        ),
        (
            at(2026, 3, 28, 12),
            at(2026, 3, 29, 22),
            BERLIN,
            "2026-03-28 13:00:00+01:00 to 2026-03-30 00:00:00+02:00 Europe/Berlin",
        ),
    ],
)
def test_a_windows_local_label_names_its_days_or_its_month(
    start: int, end: int, zone: str, label: str
) -> None:
    assert local_span(start, end, zone) == label


def test_a_window_is_labelled_in_the_zone_it_is_aligned_in() -> None:
    month = parse_period("1mo")
    berlin = ((0, BERLIN),)
    assert window_label(month, berlin, window("1mo", BERLIN, at(2026, 3, 5))) == (
        BERLIN,
        "2026-03 Europe/Berlin",
    )
    march_day = window("1d", BERLIN, at(2026, 3, 5))
    assert window_label(parse_period("1d"), berlin, march_day) == (
        BERLIN,
        "2026-03-05 Europe/Berlin",
    )
    # none: no zone, a zone of UTC, a period that stays in UTC
    assert window_label(month, (), window("1mo", BERLIN, at(2026, 3, 5))) is None
    assert window_label(month, ((0, "UTC"),), window("1mo", "UTC", at(2026, 3, 5))) is None
    hour = (at(2026, 3, 5), at(2026, 3, 5, 1))
    assert window_label(parse_period("1h"), berlin, hour) is None
    # A change on 10 March: March stays in UTC, the next window runs from
    # UTC's 1 April to Berlin's 1 May, May is Berlin's.
    changed = ((at(2026, 3, 10), BERLIN),)
    windows = [calendar_window(month, at(2026, m, 20), changed) for m in (3, 4, 5)]
    assert [window_label(month, changed, w) for w in windows] == [
        None,
        (BERLIN, "2026-04-01 02:00:00+02:00 to 2026-05-01 00:00:00+02:00 Europe/Berlin"),
        (BERLIN, "2026-05 Europe/Berlin"),
    ]


def test_a_change_at_the_instant_the_one_before_takes_effect_follows_it() -> None:
    """Berlin from 10 March takes effect at UTC's 1 April; Kolkata, given at that
    very instant, where Berlin's first window ends (1 May)."""
    month = parse_period("1mo")
    history = ((at(2026, 3, 10), BERLIN), (at(2026, 4, 1), "Asia/Kolkata"))
    found = [
        (window_zone(month, history, moment), zoned_window(month, history, moment))
        for moment in (at(2026, 3, 20), at(2026, 4, 15), at(2026, 5, 15))
    ]
    assert found == [
        ("UTC", (at(2026, 3, 1), at(2026, 4, 1))),
        (BERLIN, (at(2026, 4, 1), at(2026, 4, 30, 22))),
        ("Asia/Kolkata", (at(2026, 4, 30, 22), at(2026, 5, 31, 18, 30))),
    ]


def test_an_unknown_zone_names_its_field() -> None:
    with pytest.raises(InvalidInput) as refused:
        validate_zone("Mars/Olympus")
    assert (refused.value.field, str(refused.value)) == (
        "time_zone",
        "time_zone: 'Mars/Olympus' is not an IANA time zone name like 'Europe/Berlin'",
    )
    with pytest.raises(InvalidInput) as refused:
        validate_zone(5, field_name="zone")
    assert str(refused.value) == "zone: 5 is not an IANA time zone name like 'Europe/Berlin'"


def test_a_clock_set_back_across_midnight_starts_the_next_day_at_its_first_midnight() -> None:
    """Goose Bay went back from 00:01 to 23:01 on 7 November 2010: the
    instants shown as 6 November again are in the 7th's 25-hour day."""
    zone = "America/Goose_Bay"
    seventh = (at(2010, 11, 7, 3), at(2010, 11, 8, 4))
    assert window("1d", zone, at(2010, 11, 7, 2, 59)) == (at(2010, 11, 6, 3), seventh[0])
    for moment in (at(2010, 11, 7, 3), at(2010, 11, 7, 3, 5), at(2010, 11, 8, 3, 59)):
        assert window("1d", zone, moment) == seventh


def test_a_month_across_a_new_year_is_labelled_as_a_month() -> None:
    december = window("1mo", BERLIN, at(2026, 12, 15))
    assert local_span(*december, BERLIN) == "2026-12 Europe/Berlin"
