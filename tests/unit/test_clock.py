"""Clocks (`metering/clock.py`): a frozen clock moves only when told, and a
retry's wait doubles from the first up to its maximum."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from metering.clock import FrozenClock, backoff_seconds, system_clock

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_a_frozen_clock_stands_still_until_moved() -> None:
    clock = FrozenClock(NOW)
    assert clock() == clock() == NOW
    assert clock.advance(timedelta(minutes=1)) == NOW + timedelta(minutes=1)
    assert clock.advance(seconds=30) == NOW + timedelta(minutes=1, seconds=30)
    assert clock() == NOW + timedelta(seconds=90)
    clock.set(NOW)
    assert clock() == NOW


def test_a_frozen_clock_needs_an_aware_instant() -> None:
    with pytest.raises(ValueError, match="aware"):
        FrozenClock(datetime(2026, 11, 22, 12, 0))
    paris = timezone(timedelta(hours=1))
    assert FrozenClock(datetime(2026, 11, 22, 13, 0, tzinfo=paris))() == NOW


def test_the_system_clock_is_aware_and_utc() -> None:
    before = datetime.now(UTC)
    now = system_clock()
    assert now.tzinfo is UTC and before <= now <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("failures", "wait"),
    [(0, 0.25), (1, 0.25), (2, 0.5), (3, 1.0), (8, 30.0), (9, 30), (10_000, 30)],
)
def test_a_retry_waits_double_after_each_failure_up_to_the_maximum(
    failures: int, wait: float
) -> None:
    assert backoff_seconds(failures, 0.25, 30) == wait
