"""Reservations on SQLite and PostgreSQL, with a frozen clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.errors import (
    EventConflict,
    InvalidInput,
    ReservationExpired,
    ReservationSettled,
    UnknownLimit,
    UnknownReservation,
)
from metering.storage.tables import counters, reservations, results

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


def snapshot(meter: Meter) -> tuple[object, ...]:
    with meter.sql_engine.connect() as connection:
        return tuple(
            tuple(connection.execute(select(table).order_by(*table.primary_key)).all())
            for table in (counters, results, reservations)
        )


def test_reserve_consumes_now_and_cancel_gives_it_back(meter: Meter) -> None:
    r = meter.reserve("10.0.0.7", "bad_login", cost=2)
    assert r.allowed and r.state == "held" and r.decision.remaining == 1
    assert r.expires_at == START + timedelta(seconds=60)
    assert used(meter, "10.0.0.7", "bad_login") == 2
    assert meter.result(r.id) is not None  # recorded like any event
    assert r.cancel() == 2
    assert r.state == "cancelled"
    assert used(meter, "10.0.0.7", "bad_login") == 0
    info = meter.reservation(r.id)
    assert info is not None and info.state == "cancelled" and info.settled_by == "cancel"


def test_a_second_cancel_does_nothing(meter: Meter) -> None:
    r = meter.reserve("ip", "bad_login")
    meter.consume("ip", "bad_login")
    assert r.cancel() == 1
    assert r.cancel() == 0
    assert meter.cancel_reservation(r.id) == 0
    assert used(meter, "ip", "bad_login") == 1


def test_commit_is_final_and_cancel_after_commit_raises(meter: Meter) -> None:
    r = meter.reserve("ip", "bad_login")
    r.commit()
    r.commit()  # twice: nothing
    with pytest.raises(ReservationSettled, match="committed"):
        r.cancel()
    assert used(meter, "ip", "bad_login") == 1
    cancelled = meter.reserve("ip", "bad_login")
    cancelled.cancel()
    with pytest.raises(ReservationSettled, match="cancelled"):
        cancelled.commit()


def test_leaving_the_block_commits_and_cancel_inside_gives_back(meter: Meter) -> None:
    with meter.reserve("ip", "bad_login") as kept:
        pass
    assert kept.state == "committed"
    with meter.reserve("ip", "bad_login") as given:
        given.cancel()
    assert given.state == "cancelled"
    with pytest.raises(RuntimeError), meter.reserve("ip", "bad_login") as failed:
        raise RuntimeError("the handler crashed")
    assert failed.state == "committed"  # fails safe: the attempt is paid
    assert used(meter, "ip", "bad_login") == 2


def test_a_denied_reservation_holds_nothing(meter: Meter) -> None:
    for _ in range(3):
        meter.reserve("ip", "bad_login")
    denied = meter.reserve("ip", "bad_login")
    assert not denied.allowed and denied.state == "denied" and denied.expires_at is None
    assert denied.decision.retry_at == START + timedelta(hours=1)
    assert denied.cancel() == 0
    denied.commit()
    assert meter.reservation(denied.id) is None
    assert used(meter, "ip", "bad_login") == 3


def test_cancel_past_the_time_to_live_commits_even_before_the_sweeper(
    meter: Meter, clock: FrozenClock
) -> None:
    r = meter.reserve("ip", "bad_login", ttl_seconds=5)
    clock.advance(seconds=5)
    with pytest.raises(ReservationExpired):
        r.cancel()
    assert r.state == "committed"
    assert used(meter, "ip", "bad_login") == 1
    assert meter.sweep_reservations()["committed"] == 0


def test_cancel_after_the_window_reset_gives_nothing_back(meter: Meter, clock: FrozenClock) -> None:
    clock.set(START + timedelta(minutes=59, seconds=30))
    r = meter.reserve("ip", "hourly", cost=4, ttl_seconds=120)
    clock.advance(seconds=31)  # a new calendar hour
    meter.consume("ip", "hourly", cost=5)
    assert r.cancel() == 0
    assert r.state == "cancelled"
    assert [c.used for c in meter.counters("ip", "hourly")] == [4, 5]


def test_cancel_returns_tokens_to_a_bucket_without_exceeding_capacity(
    meter: Meter, clock: FrozenClock
) -> None:
    r = meter.reserve("key", "api", cost=6)
    assert meter.check("key", "api", cost=5).allowed is False  # 4 left
    assert r.cancel() == 6
    assert meter.check("key", "api", cost=10).allowed  # full again, no more
    assert not meter.check("key", "api", cost=11).allowed

    partly = meter.reserve("key", "api", cost=6)
    clock.advance(seconds=4)  # 4 tokens refilled: only 2 are missing now
    assert partly.cancel() == 2
    assert meter.check("key", "api", cost=10).allowed
    assert not meter.check("key", "api", cost=11).allowed


def test_stacked_reservation_gives_back_to_every_counter(meter: Meter) -> None:
    r = meter.reserve(charges=[("user-1", "hourly", 2), ("org-9", "org", 2)])
    assert r.allowed and len(r.decision.charges) == 2
    assert r.cancel() == 4
    assert used(meter, "user-1", "hourly") == 0 and used(meter, "org-9", "org") == 0


def test_a_repeated_reservation_id_returns_the_same_reservation(meter: Meter) -> None:
    first = meter.reserve("ip", "bad_login", event_id="login-1")
    again = meter.reserve("ip", "bad_login", event_id="login-1")
    assert again.decision.duplicate and again.state == "held" and again.id == "login-1"
    assert used(meter, "ip", "bad_login") == 1
    first.cancel()
    assert meter.reserve("ip", "bad_login", event_id="login-1").state == "cancelled"
    with pytest.raises(EventConflict):
        meter.reserve("ip", "bad_login", cost=2, event_id="login-1")
    meter.consume("ip", "bad_login", event_id="consumed-1")
    assert meter.reserve("ip", "bad_login", event_id="consumed-1").state == "committed"


def test_reservations_and_consumes_interleave_on_one_counter(meter: Meter) -> None:
    held = [meter.reserve("s", "hourly") for _ in range(3)]
    meter.consume("s", "hourly")
    assert not meter.consume("s", "hourly", cost=2).allowed  # 4 used of 5
    held[0].cancel()
    assert meter.consume("s", "hourly", cost=2).allowed
    assert used(meter, "s", "hourly") == 5


def test_bad_input_raises_and_changes_nothing(meter: Meter) -> None:
    meter.reserve("ip", "bad_login")
    before = snapshot(meter)
    with pytest.raises(UnknownLimit):
        meter.reserve("ip", "nope")
    with pytest.raises(InvalidInput):
        meter.reserve("ip", "bad_login", cost=0)
    for ttl in (0, -1, float("nan"), 10**9, "60"):
        with pytest.raises(InvalidInput):
            meter.reserve("ip", "bad_login", ttl_seconds=ttl)  # type: ignore[arg-type]
    with pytest.raises(UnknownReservation):
        meter.cancel_reservation("no-such-reservation")
    with pytest.raises(UnknownReservation):
        meter.commit_reservation("no-such-reservation")
    with pytest.raises(InvalidInput):
        meter.cancel_reservation("")
    with pytest.raises(InvalidInput):
        meter.reservations(state="lost")
    assert snapshot(meter) == before


# -- reset while a reservation is held -----------------------------------------


@pytest.mark.parametrize(("limit", "maximum"), [("hourly", 5), ("api", 10)])
def test_a_reservation_made_before_a_reset_gives_nothing_back_after_it(
    meter: Meter, limit: str, maximum: int
) -> None:
    """The reset wiped the held units with the rest: cancelling afterwards
    must not return them to the counter that started over (an over-grant)."""
    held = meter.reserve("10.0.0.9", limit, maximum)
    meter.reset(subject="10.0.0.9", limit=limit)
    first = [meter.consume("10.0.0.9", limit).allowed for _ in range(maximum)]
    assert held.cancel() == 0
    second = [meter.consume("10.0.0.9", limit).allowed for _ in range(maximum)]

    assert first == [True] * maximum and second == [False] * maximum
    assert used(meter, "10.0.0.9", limit) == maximum


def test_a_reset_of_another_subject_or_limit_keeps_a_reservation_whole(meter: Meter) -> None:
    held = meter.reserve("10.0.0.9", "hourly", 2)
    both = meter.reserve(charges=[("10.0.0.9", "hourly", 1), ("10.0.0.9", "org", 4)])
    meter.reset(subject="10.0.0.8")
    meter.reset(limit="org")
    assert held.cancel() == 2
    assert both.cancel() == 1  # its org charge was reset; its hourly charge comes back
    assert used(meter, "10.0.0.9", "hourly") == 0
