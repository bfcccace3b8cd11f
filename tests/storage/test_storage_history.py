"""The usage history's statements (`storage/history.py`) on SQLite and
PostgreSQL: hours from the rollups, a subject's windows with their denials,
every change of its maximum, and the usage page's secret and its rotation."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import to_us
from metering.storage.history import (
    WindowRow,
    counter_windows,
    entitlement_changes,
    portal_secret,
    portal_secrets,
    rollup_hours,
    rotate_secret,
)
from metering.storage.rollups import record_rollups

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
START_US = to_us(START)
HOUR = 3_600_000_000


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        yield meter


def test_hours_sum_one_dimensions_values_in_the_period(meter: Meter) -> None:
    deltas = {
        ("org", "calls", "route", 0, "/a"): (2, 1),
        ("org", "calls", "route", 0, "/b"): (3, 1),
        ("org", "calls", "route", HOUR, "/a"): (4, 1),
        ("org", "calls", "route", 2 * HOUR, "/a"): (8, 1),
        ("org", "calls", "region", 0, "eu"): (100, 1),
        ("other", "calls", "route", 0, "/a"): (100, 1),
    }
    meter.database.run(lambda connection: record_rollups(connection, deltas))
    hours = meter.database.run(
        lambda connection: rollup_hours(connection, "org", "calls", "route", 0, 2 * HOUR)
    )
    assert hours == [(0, 5), (HOUR, 4)]


def test_a_subjects_windows_come_oldest_first_with_their_denials(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
    meter.set_limit(Limit("api", maximum=5, period="1s", algorithm="token_bucket"))
    meter.consume("org", "calls")
    meter.consume("org", "calls", cost=3)  # denied
    meter.consume("org", "api")
    meter.consume("other", "calls")
    clock.advance(timedelta(hours=1))
    meter.consume("org", "calls")

    def windows(limit: str | None, from_us: int, to_us: int) -> list[WindowRow]:
        return meter.database.run(
            lambda connection: counter_windows(connection, "org", limit, from_us, to_us)
        )

    first = WindowRow("calls", START_US, START_US + HOUR, 1, 1, 3, START_US)
    second = WindowRow("calls", START_US + HOUR, START_US + 2 * HOUR, 1, 0, 0, None)
    assert windows(None, 0, START_US + 3 * HOUR) == [first, second]  # no bucket
    assert windows("calls", START_US + 1, START_US + 3 * HOUR) == [second]
    assert windows("api", 0, START_US + 3 * HOUR) == []


def test_every_change_of_a_maximum_in_time_order(meter: Meter) -> None:
    meter.set_limit(Limit("calls", maximum=10, period="1h"))
    meter.set_entitlement("org", "calls", 50, START + timedelta(days=1))
    meter.set_entitlement("org", "calls", None, START + timedelta(days=2))
    meter.set_entitlement("org", "calls", 20, START)
    changes = meter.database.run(lambda connection: entitlement_changes(connection, "org", "calls"))
    day = 24 * HOUR
    assert changes == [(START_US, 20), (START_US + day, 50), (START_US + 2 * day, None)]


def test_the_secret_is_made_once(meter: Meter) -> None:
    first = meter.database.run(lambda connection: portal_secret(connection, START_US))
    again = meter.database.run(lambda connection: portal_secret(connection, START_US + 1))
    other = meter.database.run(lambda connection: portal_secret(connection, START_US, "other"))
    assert first == again != other
    assert len(first) >= 43  # 256 random bits, base64url


def test_a_rotated_secret_is_kept_until_its_grace_ends(meter: Meter) -> None:
    old = meter.database.run(lambda connection: portal_secret(connection, START_US))
    meter.database.run(lambda connection: rotate_secret(connection, START_US, START_US + 10))
    new, kept = meter.database.run(lambda connection: portal_secrets(connection, START_US + 9))
    assert kept == old != new
    assert meter.database.run(lambda connection: portal_secrets(connection, START_US + 10)) == [new]


def test_rotating_a_secret_never_made_makes_it(meter: Meter) -> None:
    meter.database.run(lambda connection: rotate_secret(connection, START_US, START_US + 10))
    made = meter.database.run(lambda connection: portal_secrets(connection, START_US))
    assert len(made) == 1
