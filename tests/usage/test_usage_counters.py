"""Counters as an operator sees them (`metering/usage/counters.py`), on both
databases: every window of a subject and/or limit, oldest first, a bucket
with no window, a zoned subject's window labelled in its zone; the seats of a
distinct limit; a reset clears current counters only and needs a subject or
a limit, never one of the product's own."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=3, period="1h", window="calendar"),
                Limit("daily", maximum=9, period="1d", window="calendar"),
                Limit("burst", maximum=5, period="10s", algorithm="token_bucket"),
                Limit("seats", maximum=2, period="1h", window="calendar", distinct="user"),
            ]
        )
        yield meter


def test_every_window_of_a_subject_or_limit_oldest_first(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("a", "calls", 2)
    meter.consume("a", "calls", 2)  # denied
    meter.consume("a", "burst")
    meter.consume("b", "calls")
    clock.advance(hours=1)
    meter.consume("a", "calls")
    windows = [(c.window_start, c.used) for c in meter.counters("a", "calls")]
    assert windows == [(NOW, 2), (NOW + timedelta(hours=1), 1)]
    first = meter.counters("a", "calls")[0]
    assert (first.window_end, first.denied_count, first.denied_cost) == (
        NOW + timedelta(hours=1),
        1,
        2,
    )
    assert first.first_denied_at == NOW and first.time_zone is None
    [bucket] = meter.counters(limit="burst")
    assert (bucket.window_start, bucket.window_end, bucket.used) == (None, None, 1)
    assert {c.subject for c in meter.counters(limit="calls")} == {"a", "b"}
    assert len(meter.counters()) == 4
    with pytest.raises(InvalidInput):
        meter.counters(subject=" a")


def test_a_zoned_subjects_window_is_labelled_in_its_zone(meter: Meter, clock: FrozenClock) -> None:
    meter.set_time_zone("tokyo", "Asia/Tokyo")
    clock.advance(days=1)  # the zone is in force from the end of each current window
    meter.consume("tokyo", "daily")
    meter.consume("plain", "daily")
    [zoned] = meter.counters("tokyo", "daily")
    [plain] = meter.counters("plain", "daily")
    assert (plain.time_zone, plain.local_window) == (None, None)
    assert zoned.time_zone == "Asia/Tokyo"
    # The UTC day that ended is followed by a window to the next local midnight.
    assert zoned.window_start == datetime(2026, 11, 23, tzinfo=UTC)
    assert zoned.local_window == (
        "2026-11-23 09:00:00+09:00 to 2026-11-24 00:00:00+09:00 Asia/Tokyo"
    )


def test_the_seats_of_a_distinct_limit(meter: Meter) -> None:
    for user in ("ann", "bob", "ann"):
        meter.consume("org", "seats", metadata={"user": user})
    assert meter.seats("org", "seats") == ["ann", "bob"]
    assert meter.seats("org", "seats", NOW - timedelta(hours=2)) == []
    with pytest.raises(UnknownLimit):
        meter.seats("org", "nope")


def test_a_reset_clears_current_counters_only(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("a", "calls", 3)
    clock.advance(hours=1)
    meter.consume("a", "calls", 1)
    meter.consume("a", "daily", 1)
    assert meter.reset("a", "calls") == 1
    assert [c.used for c in meter.counters("a", "calls")] == [3]  # the past window stays
    assert meter.reset(limit="daily") == 1
    with pytest.raises(InvalidInput, match="give a subject, a limit or both"):
        meter.reset()
    with pytest.raises(ReservedLimit):
        meter.reset(limit="metering.api_requests")
    with pytest.raises(InvalidInput):
        meter.reset(subject="")
