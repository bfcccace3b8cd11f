"""Subjects' time zones through `Meter`, on SQLite and PostgreSQL, on a frozen clock.

A calendar window of days or months of a subject with a zone starts at its local
midnight on every path: the one-trip PostgreSQL function (its window passed in), the
fast path (direct, and on a SQLAlchemy connection) and the reference engine decide
it alike (`tests/engine/test_differential.py` holds them to each other with zoned
subjects in the streams). Here, example by example: Berlin's 23-hour day, a denial's
retry at the local midnight, a change of zone from where the window ends, a check and
the usage page, first-use windows and buckets left alone, and an unknown zone refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from decision_paths import apply_reference

from metering import FrozenClock, Limit, Meter, make_event
from metering.domain.needs import Need
from metering.engine.one_trip import ONE_TRIP_IMPLEMENTS
from metering.errors import InvalidInput
from metering.usage.current import subject_usage

# Zones set in January: in force for the days and months from February on.
JANUARY = datetime(2026, 1, 15, tzinfo=UTC)
DAILY = Limit("daily", maximum=3, period="1d", window="calendar")
MONTHLY = Limit("monthly", maximum=100, period="1mo", window="calendar", enforcement="soft")
HOURLY = Limit("hourly", maximum=100, period="1h", window="calendar")
FIRST_USE = Limit("first_use", maximum=100, period="1d")


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(JANUARY)) as meter:
        meter.set_limits([DAILY, MONTHLY, HOURLY, FIRST_USE])
        meter.set_time_zone("org-berlin", "Europe/Berlin")
        meter.set_time_zone("org-kathmandu", "Asia/Kathmandu")
        yield meter


def _clock(meter: Meter) -> FrozenClock:
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    return clock


def test_the_function_decides_a_zoned_window() -> None:
    assert Need.TIME_ZONE in ONE_TRIP_IMPLEMENTS


def test_a_berlin_day_of_23_hours(meter: Meter) -> None:
    _clock(meter).set(datetime(2026, 3, 29, 12, tzinfo=UTC))
    decided = meter.consume("org-berlin", "daily", 3)
    charge = decided.charges[0]
    assert charge.window_start == datetime(2026, 3, 28, 23, tzinfo=UTC)
    assert charge.resets_at == datetime(2026, 3, 29, 22, tzinfo=UTC)
    denied = meter.consume("org-berlin", "daily", 1)
    assert not denied.allowed and denied.retry_at == datetime(2026, 3, 29, 22, tzinfo=UTC)
    # The same subject's month starts at Berlin's midnight too; its hours stay UTC's.
    month = meter.consume("org-berlin", "monthly", 1).charges[0]
    assert month.window_start == datetime(2026, 2, 28, 23, tzinfo=UTC)
    assert month.resets_at == datetime(2026, 3, 31, 22, tzinfo=UTC)
    hour = meter.consume("org-berlin", "hourly", 1).charges[0]
    assert hour.window_start == datetime(2026, 3, 29, 12, tzinfo=UTC)
    # A subject without a zone keeps UTC's days.
    other = meter.consume("org-utc", "daily", 1).charges[0]
    assert other.window_start == datetime(2026, 3, 29, tzinfo=UTC)
    _clock(meter).set(datetime(2026, 3, 29, 22, tzinfo=UTC))
    assert meter.consume("org-berlin", "daily", 3).allowed  # a new Berlin day
    # Counters show the UTC instants and the local label.
    labels = [(c.limit, c.time_zone, c.local_window) for c in meter.counters("org-berlin")]
    assert labels == [
        ("daily", "Europe/Berlin", "2026-03-29 Europe/Berlin"),
        ("daily", "Europe/Berlin", "2026-03-30 Europe/Berlin"),
        ("hourly", None, None),
        ("monthly", "Europe/Berlin", "2026-03 Europe/Berlin"),
    ]
    assert meter.counters("org-utc")[0].local_window is None


def test_a_batch_a_check_and_the_reference_agree(meter: Meter) -> None:
    at = datetime(2026, 4, 5, 18, 10, tzinfo=UTC)  # 23:55 in Kathmandu
    _clock(meter).set(at + timedelta(minutes=10))
    events = [
        make_event([("org-kathmandu", "daily", 2)], at, "e-1"),
        make_event([("org-kathmandu", "daily", 1)], at + timedelta(minutes=5), "e-2"),
        make_event([("org-kathmandu", "daily", 1)], at + timedelta(minutes=9), "e-3"),
    ]
    decided = meter.apply(events)
    starts = [d.charges[0].window_start for d in decided]  # type: ignore[union-attr]
    midnight = datetime(2026, 4, 5, 18, 15, tzinfo=UTC)
    assert starts == [midnight - timedelta(days=1), midnight, midnight]
    assert [d.allowed for d in decided] == [True, True, True]  # type: ignore[union-attr]
    check = meter.check("org-kathmandu", "daily", 2)
    assert not check.allowed and check.retry_at == midnight + timedelta(days=1)
    late = make_event([("org-kathmandu", "daily", 1)], at + timedelta(minutes=1), "e-4")
    reference = apply_reference(meter._engine, [late.record()], meter.database.now_us())
    assert reference[0].kind == "new"
    # The late event went to the day before Kathmandu's midnight: 2 + 1.
    counted = [(c.window_start, c.used) for c in meter.counters("org-kathmandu", "daily")]
    assert counted == [(midnight - timedelta(days=1), 3), (midnight, 2)]
    [usage] = [u for u in subject_usage(meter.database, "org-kathmandu") if u.limit.name == "daily"]
    assert usage.resets_at == midnight + timedelta(days=1)


def test_a_change_of_zone_waits_for_the_window_to_end(meter: Meter) -> None:
    clock = _clock(meter)
    clock.set(datetime(2026, 11, 14, 10, tzinfo=UTC))
    assert meter.consume("org-new", "monthly", 1).charges[0].window_start == datetime(
        2026, 11, 1, tzinfo=UTC
    )
    changed = meter.set_time_zone("org-new", "Asia/Kolkata")
    assert changed.time_zone == "Asia/Kolkata" and changed.since == clock()
    assert meter.subject_zone("org-new") == changed
    current = meter.consume("org-new", "monthly", 1).charges[0]
    assert (current.window_start, current.used) == (datetime(2026, 11, 1, tzinfo=UTC), 2)
    assert current.resets_at == datetime(2026, 12, 1, tzinfo=UTC)
    clock.set(datetime(2026, 12, 2, tzinfo=UTC))
    transition = meter.consume("org-new", "monthly", 1).charges[0]
    assert transition.window_start == datetime(2026, 12, 1, tzinfo=UTC)
    assert transition.resets_at == datetime(2026, 12, 31, 18, 30, tzinfo=UTC)
    clock.set(datetime(2027, 1, 2, tzinfo=UTC))
    kolkata = meter.consume("org-new", "monthly", 1).charges[0]
    assert kolkata.window_start == datetime(2026, 12, 31, 18, 30, tzinfo=UTC)
    assert [c.local_window for c in meter.counters("org-new")] == [
        None,
        "2026-12-01 05:30:00+05:30 to 2027-01-01 00:00:00+05:30 Asia/Kolkata",
        "2027-01 Asia/Kolkata",
    ]


def test_first_use_windows_and_unknown_zones(meter: Meter) -> None:
    at = datetime(2026, 3, 29, 12, 34, tzinfo=UTC)
    _clock(meter).set(at)
    charge = meter.consume("org-berlin", "first_use", 1).charges[0]
    assert charge.window_start == at and charge.resets_at == at + timedelta(days=1)
    before = meter.subject_zones()
    with pytest.raises(InvalidInput, match="IANA time zone"):
        meter.set_time_zone("org-berlin", "Europe/Atlantis")
    assert meter.subject_zones() == before
    assert [z.subject for z in before] == ["org-berlin", "org-kathmandu"]
    assert meter.subject_zone("nobody").time_zone == "UTC"
    assert meter.subject_zone("nobody").since is None
