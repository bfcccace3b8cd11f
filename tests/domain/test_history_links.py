"""The pure parts of issue 23 points 3 and 4: history buckets and the maximum
in force (`metering.domain.history`), signed page links (`metering.domain.links`)."""

from __future__ import annotations

import pytest

from metering.domain.history import (
    HOUR_US,
    Point,
    bucket_starts,
    maximum_at,
    series,
    validate_bucket,
)
from metering.domain.links import parse_ttl, sign, verify
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


def test_a_link_holds_its_subject_until_it_expires() -> None:
    token = sign("s3cret", "org-1/é", 1_000)
    assert verify("s3cret", token, 999) == "org-1/é"
    assert verify("s3cret", token, 1_000) is None  # expired
    assert verify("other", token, 0) is None  # another secret
    _, _, signature = token.rpartition(".")
    forged = sign("s3cret", "org-2", 1_000).rpartition(".")[0] + "." + signature
    assert verify("s3cret", forged, 0) is None
    longer = token.replace(".1000.", ".9999.")
    assert verify("s3cret", longer, 0) is None
    for junk in ("", "v1", "v1.a.b.c", None, 5, "x" * 3000):
        assert verify("s3cret", junk, 0) is None


def test_ttl_durations() -> None:
    assert parse_ttl("1h") == 3600
    assert parse_ttl("30m") == 1800
    assert parse_ttl("7d") == 7 * 86400
    assert parse_ttl("90") == 90
    for bad in ("0s", "1y", "-1h", "", "h", "40d", "\uff11h"):
        with pytest.raises(InvalidInput, match="ttl"):
            parse_ttl(bad)
