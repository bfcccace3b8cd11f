"""The reservations' operations (`metering/reservations/admin.py`) on SQLite
and PostgreSQL, with a frozen clock: the sweeper commits what is past its time
to live and deletes settled ones past the retention (a cancelled one stays
with its result); listings by state and subject; bad listings and sweeps are
refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import (
    InvalidInput,
    ReservationSettled,
)

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("bad_login", maximum=3, period="1h"))
        m.set_limit(Limit("hourly", maximum=5, period="1h", window="calendar"))
        m.set_limit(Limit("api", maximum=10, period="10s", algorithm="token_bucket"))
        m.set_limit(Limit("org", maximum=100, period="1d", window="calendar"))
        yield m


def used(meter: Meter, subject: str, limit: str) -> int:
    return sum(c.used for c in meter.counters(subject, limit))


def test_the_sweeper_commits_reservations_past_their_time_to_live(
    meter: Meter, clock: FrozenClock
) -> None:
    short = meter.reserve("ip", "bad_login", ttl_seconds=30)
    long = meter.reserve("ip", "bad_login", ttl_seconds=120)
    clock.advance(seconds=60)
    assert meter.sweep_reservations() == {"committed": 1, "released": 0, "deleted": 0}
    assert [r.id for r in meter.reservations(state="committed")] == [short.id]
    with pytest.raises(ReservationSettled):
        short.cancel()
    assert long.cancel() == 1
    assert used(meter, "ip", "bad_login") == 1
    clock.advance(days=8)
    # The cancelled one stays with its result: a void must see what it gave back.
    assert meter.sweep_reservations(retention_seconds=7 * 86400) == {
        "committed": 0,
        "released": 0,
        "deleted": 1,
    }
    assert [r.id for r in meter.reservations()] == [long.id]


def test_listing_by_state_and_subject(meter: Meter, clock: FrozenClock) -> None:
    a = meter.reserve("10.0.0.1", "bad_login")
    clock.advance(seconds=1)
    b = meter.reserve("10.0.0.2", "bad_login")
    clock.advance(seconds=1)
    c = meter.reserve("a_b%", "bad_login")
    b.cancel()
    assert [r.id for r in meter.reservations()] == [c.id, b.id, a.id]
    assert [r.id for r in meter.reservations(state="held")] == [c.id, a.id]
    assert [r.id for r in meter.reservations(subject="10.0.0.2")] == [b.id]
    assert [r.id for r in meter.reservations(subject="a_b%")] == [c.id]
    assert meter.reservations(subject="a_bx") == []
    [info] = meter.reservations(subject="10.0.0.1")
    assert info.expires_at == START + timedelta(seconds=60)
    assert info.charges[0].subject == "10.0.0.1" and info.charges[0].cost == 1


def test_bad_listings_and_sweeps_are_refused(meter: Meter) -> None:
    meter.reserve("ip", "bad_login")
    for bad in ({"state": "lost"}, {"state": "denied"}, {"subject": ""}, {"count": 0}):
        with pytest.raises(InvalidInput):
            meter.reservations(**bad)  # type: ignore[arg-type]
    for retention in (-1, float("nan")):
        with pytest.raises(InvalidInput):
            meter.sweep_reservations(retention_seconds=retention)
    assert [r.state for r in meter.reservations()] == ["held"]
    assert meter.reservation("never") is None
