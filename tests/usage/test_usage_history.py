"""A subject's usage of one limit over time (`metering/usage/history.py`), on
both databases: by day from the counters, by hour from a limit's rollups,
nothing from a token bucket; the default span up to now; each bucket with the
maximum in force at its end; a gauge's peak, not its sum; bad input refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidInput, UnknownLimit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW - 2 * DAY)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("tokens", maximum=100, period="1d", window="calendar"),
                Limit("calls", maximum=50, period="1h", dimensions=("route",)),
                Limit("burst", maximum=5, period="10s", algorithm="token_bucket"),
                Limit("disk", maximum=100, period="1d", window="calendar", aggregation="max"),
            ]
        )
        for day in range(3):
            clock.set(NOW - (2 - day) * DAY)
            meter.consume("org", "tokens", 10 + day)
            meter.consume("org", "calls", 2, metadata={"route": "/a"})
            meter.consume("org", "burst")
            meter.consume("org", "disk", 30 + day)
            meter.consume("org", "disk", 5)
        yield meter


def test_by_day_from_the_counters_with_the_maximum_in_force(meter: Meter) -> None:
    meter.set_entitlement("org", "tokens", 300, effective_from=NOW - DAY)
    found = meter.usage_history("org", "tokens", since=NOW - 2 * DAY, until=NOW + DAY)
    assert (found.source, found.bucket) == ("counters", "day")
    assert [(p.used, p.maximum) for p in found.points] == [
        (10, 100),
        (11, 300),
        (12, 300),
        (0, 300),
    ]
    shown = found.to_dict()
    assert (shown["limit"], shown["from"]) == ("tokens", (NOW - 2 * DAY).isoformat())
    assert shown["points"][0]["start"] == "2026-11-20T00:00:00+00:00"


def test_a_bucket_takes_the_default_in_force_at_its_end(meter: Meter) -> None:
    meter.set_limit(Limit("tokens", maximum=200, period="1d", window="calendar"))  # at NOW
    found = meter.usage_history("org", "tokens", since=NOW - 2 * DAY, until=NOW + DAY)
    # Nov 20 and 21 ended under 100; Nov 22, open at the change, ends under 200.
    assert [(p.used, p.maximum) for p in found.points] == [
        (10, 100),
        (11, 100),
        (12, 200),
        (0, 200),
    ]


def test_by_hour_from_the_rollups_of_a_limit_with_dimensions(meter: Meter) -> None:
    found = meter.usage_history(
        "org",
        "calls",
        since=NOW - timedelta(hours=1),
        until=NOW + timedelta(hours=1),
        bucket="hour",
    )
    assert found.source == "rollups"
    assert [p.used for p in found.points] == [0, 2]


def test_the_default_span_is_up_to_now_and_a_bucket_keeps_no_history(meter: Meter) -> None:
    by_day = meter.usage_history("org", "tokens")
    assert by_day.until == NOW and by_day.since == NOW - 30 * DAY
    assert sum(p.used for p in by_day.points) == 10 + 11 + 12
    by_hour = meter.usage_history("org", "tokens", bucket="hour")
    assert by_hour.since == NOW - timedelta(hours=48)
    burst = meter.usage_history("org", "burst")
    assert burst.source == "none" and all(p.used == 0 and p.maximum is None for p in burst.points)


def test_a_gauges_bucket_shows_its_peak(meter: Meter) -> None:
    found = meter.usage_history("org", "disk", since=NOW - 2 * DAY, until=NOW + DAY)
    assert [p.used for p in found.points] == [30, 31, 32, 0]


def test_bad_input_is_refused(meter: Meter) -> None:
    with pytest.raises(UnknownLimit):
        meter.usage_history("org", "nope")
    with pytest.raises(InvalidInput):
        meter.usage_history("org", "tokens", bucket="week")
    with pytest.raises(InvalidInput):
        meter.usage_history("", "tokens")
