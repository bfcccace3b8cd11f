"""The pure parts of issue 23 points 3 and 4: history buckets and the maximum
in force (`metering.domain.history`), and what a bad period or time to live
says; the signed page links themselves are in test_links.py."""

from __future__ import annotations

from typing import Any

import pytest

from metering.domain.definitions import Definition
from metering.domain.history import (
    HOUR_US,
    Point,
    bucket_starts,
    maximum_at,
    series,
    validate_bucket,
)
from metering.domain.links import parse_ttl
from metering.errors import InvalidInput

DAY_US = 24 * HOUR_US


def test_series_sums_usage_per_bucket_and_keeps_empty_ones() -> None:
    usage = [(0, 1), (HOUR_US - 1, 2), (HOUR_US, 5), (3 * HOUR_US, 7), (-1, 100)]
    points = series(usage, [], 10, 0, 3 * HOUR_US, "hour")
    assert points == [
        Point(0, HOUR_US, 3, 10),
        Point(HOUR_US, 2 * HOUR_US, 5, 10),
        Point(2 * HOUR_US, 3 * HOUR_US, 0, 10),
    ]


def test_the_maximum_in_force_is_the_latest_change_by_the_bucket_end() -> None:
    changes = [(2 * DAY_US, None), (DAY_US + 5, 50)]  # any order
    assert maximum_at(changes, 10, DAY_US) == 10
    assert maximum_at(changes, 10, DAY_US + 5) == 50
    assert maximum_at(changes, 10, 2 * DAY_US) == 10  # back to the default
    days = series([], changes, 10, 0, 3 * DAY_US, "day")
    assert [p.maximum for p in days] == [10, 50, 10]


def test_buckets_refuse_an_empty_or_too_long_period() -> None:
    with pytest.raises(InvalidInput, match="after from"):
        bucket_starts(5, 5, "day")
    with pytest.raises(InvalidInput, match="at most 2000"):
        bucket_starts(0, 3000 * HOUR_US, "hour")
    with pytest.raises(InvalidInput):
        validate_bucket("week")
    assert bucket_starts(1, DAY_US + 1, "day") == [0, DAY_US]


@pytest.mark.parametrize(
    ("call", "field", "message"),
    [
        (lambda: bucket_starts(5, 5, "day"), "to", "must be after from"),
        (
            lambda: bucket_starts(0, 3000 * HOUR_US, "hour"),
            "from",
            "the period holds 3000 hours; at most 2000 at once",
        ),
        (lambda: validate_bucket("week"), "bucket", "must be one of hour, day; got 'week'"),
        (lambda: parse_ttl("x"), "ttl", "expected a duration like 30m, 1h or 7d; got 'x'"),
        (lambda: parse_ttl(True), "ttl", "must be 1 second to 31 days; got True"),
        (lambda: parse_ttl("0s"), "ttl", "must be 1 second to 31 days; got 0"),
        (lambda: parse_ttl("32d"), "ttl", "must be 1 second to 31 days; got 2764800"),
    ],
)
def test_bad_periods_and_durations_say_why(call: Any, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        call()
    assert (raised.value.field, str(raised.value)) == (field, f"{field}: {message}")


def test_buckets_start_on_the_bucket_and_2000_fit() -> None:
    assert bucket_starts(DAY_US + 1, 3 * DAY_US, "day") == [DAY_US, 2 * DAY_US]
    assert len(bucket_starts(0, 2000 * HOUR_US, "hour")) == 2000


def test_the_later_change_wins_and_a_bucket_ends_at_its_last_instant() -> None:
    assert maximum_at([(10, 50), (20, 5)], 1, 30) == 5
    assert maximum_at([(10, 50), (10, 7)], 1, 30) == 7  # recorded later
    points = series([], [(HOUR_US - 1, 5)], 10, 0, 2 * HOUR_US, "hour")
    assert [p.maximum for p in points] == [5, 5]


def test_a_gauges_buckets_take_the_peak_or_the_last_level() -> None:
    usage = [(10, 4), (20, 9), (30, 2), (HOUR_US * 5, 7), (HOUR_US + 1, 3)]
    peaks = series(usage, [], 10, 0, 2 * HOUR_US, "hour", "max")
    assert [p.used for p in peaks] == [9, 3]  # a level past the buckets is left out
    lasts = series(usage, [], 10, 0, 2 * HOUR_US, "hour", "latest")
    assert [p.used for p in lasts] == [2, 3]


def test_each_bucket_takes_the_default_maximum_in_force_at_its_end() -> None:
    defaults = [Definition(0, 10, "hard"), Definition(DAY_US + 5, 20, "soft")]
    days = series([], [], 99, 0, 3 * DAY_US, "day", defaults=defaults)
    assert days == [
        Point(0, DAY_US, 0, 10),
        Point(DAY_US, 2 * DAY_US, 0, 20),
        Point(2 * DAY_US, 3 * DAY_US, 0, 20),
    ]
    # A subject's own maximum wins over the default; no maximum (a bucket's) stays none.
    entitled = series([], [(2 * DAY_US, 7)], 99, 0, 3 * DAY_US, "day", defaults=defaults)
    assert [p.maximum for p in entitled] == [10, 20, 7]
    assert [p.maximum for p in series([], [], None, 0, DAY_US, "day", defaults=defaults)] == [None]
