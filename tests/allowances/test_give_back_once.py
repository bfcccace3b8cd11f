"""Every pair of operations on one event gives usage back at most once.

Void, cancel, commit, reset and prune each may give an event's usage back or
end the chance to; whatever order they come in, the counters end where
applying the survivors one by one would leave them, and a hard limit is
never exceeded (SQLite and PostgreSQL, frozen clock).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import CorrectionRefused

T0 = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("rv", maximum=5, period="1h"))
        meter.set_limit(Limit("cal", maximum=5, period="1d", window="calendar"))
        meter.set_limit(Limit("tb", maximum=5, period="1h", algorithm="token_bucket"))
        yield meter


def allowed_until_denied(meter: Meter, limit: str, subject: str = "s") -> int:
    """How many more unit events the subject gets now (at most 20)."""
    for n in range(20):
        if not meter.consume(subject, limit, event_id=f"probe-{limit}-{subject}-{n}").allowed:
            return n
    return 20


def used(meter: Meter, limit: str, subject: str = "s") -> list[int]:
    return [c.used for c in meter.counters(subject, limit)]


# -- void and cancel of one reservation -------------------------------------------


def test_a_void_then_a_cancel_gives_a_reservation_back_once(meter: Meter) -> None:
    meter.consume("s", "rv", cost=2, event_id="base")
    assert meter.reserve("s", "rv", cost=3, event_id="r1").allowed
    meter.void("r1", "refund")
    assert used(meter, "rv") == [2]
    assert meter.cancel_reservation("r1") == 0
    info = meter.reservation("r1")
    assert info is not None and info.state == "cancelled" and info.settled_by == "void"
    assert used(meter, "rv") == [2]
    assert allowed_until_denied(meter, "rv") == 3


def test_a_cancel_then_a_void_gives_a_reservation_back_once(meter: Meter) -> None:
    meter.consume("s", "rv", cost=2, event_id="base")
    meter.reserve("s", "rv", cost=3, event_id="r1")
    assert meter.cancel_reservation("r1") == 3
    with pytest.raises(CorrectionRefused, match="cancelled"):
        meter.void("r1", "refund")
    assert used(meter, "rv") == [2]
    assert allowed_until_denied(meter, "rv") == 3


def test_a_void_after_a_cancel_that_returned_nothing_reverses_the_charge(
    meter: Meter, clock: FrozenClock
) -> None:
    """A cancel after the window ended gave nothing back; the void still may."""
    meter.reserve("s", "rv", cost=3, event_id="r1", ttl_seconds=7200)
    clock.advance(hours=1, seconds=1)
    assert meter.cancel_reservation("r1") == 0
    correction = meter.void("r1", "refund")
    assert [charge[2] for charge in correction.charges] == [3]
    assert used(meter, "rv") == [0]


def test_a_void_and_a_cancel_of_a_reservation_paid_by_a_grant(meter: Meter) -> None:
    meter.grant("s", "rv", 4, grant_id="top-up")
    meter.consume("s", "rv", cost=5, event_id="base")
    meter.reserve("s", "rv", cost=3, event_id="r1")  # all three from the grant
    meter.void("r1", "refund")
    assert meter.cancel_reservation("r1") == 0  # was InputRefused
    assert [g.used for g in meter.grants("s", "rv")] == [0]

    meter.reserve("s", "rv", cost=2, event_id="r2")
    assert [g.used for g in meter.grants("s", "rv")] == [2]
    assert meter.cancel_reservation("r2") == 2
    with pytest.raises(CorrectionRefused):
        meter.void("r2", "refund")
    assert [g.used for g in meter.grants("s", "rv")] == [0]
    assert allowed_until_denied(meter, "rv") == 4


def test_a_voided_reservation_cannot_be_committed(meter: Meter) -> None:
    from metering.errors import ReservationSettled

    meter.reserve("s", "rv", cost=3, event_id="r1")
    meter.void("r1", "refund")
    with pytest.raises(ReservationSettled):
        meter.commit_reservation("r1")
    assert used(meter, "rv") == [0]


# -- voids after a reset ----------------------------------------------------------


def test_a_void_of_an_event_from_before_a_reset_leaves_the_new_window_alone(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("s", "cal", cost=5, event_id="A")
    clock.advance(minutes=1)
    meter.reset(subject="s", limit="cal")
    clock.advance(minutes=1)
    assert meter.consume("s", "cal", cost=5, event_id="B").allowed
    correction = meter.void("A", "refund")
    assert correction.charges == ()  # its window was reset: nothing to give back
    assert used(meter, "cal") == [5]
    assert allowed_until_denied(meter, "cal") == 0


def test_a_reset_in_the_same_microsecond_counts_as_after_the_event(meter: Meter) -> None:
    """With one instant for all three, the void still may not reach B's usage."""
    meter.consume("s", "cal", cost=5, event_id="A")
    meter.reset(subject="s", limit="cal")
    meter.consume("s", "cal", cost=5, event_id="B")
    meter.void("A", "refund")
    assert used(meter, "cal") == [5]


def test_a_void_of_a_committed_reservation_from_before_a_reset(
    meter: Meter, clock: FrozenClock
) -> None:
    with meter.reserve("s", "cal", cost=5, event_id="R") as held:
        assert held.allowed
    clock.advance(minutes=1)
    meter.reset(limit="cal")
    clock.advance(minutes=1)
    meter.consume("s", "cal", cost=5, event_id="B")
    meter.void("R", "refund")
    assert used(meter, "cal") == [5]
    assert allowed_until_denied(meter, "cal") == 0


def test_a_void_of_a_bucket_charge_from_before_a_reset(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("s", "tb", cost=5, event_id="A")
    clock.advance(seconds=1)
    meter.reset(subject="s")
    meter.consume("s", "tb", cost=5, event_id="B")
    meter.void("A", "refund")
    assert allowed_until_denied(meter, "tb") == 0


def test_a_void_of_a_first_use_window_from_before_a_reset_writes_no_counter(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("s", "rv", cost=5, event_id="A")
    clock.advance(minutes=1)
    meter.reset(subject="s", limit="rv")
    clock.advance(minutes=1)
    meter.consume("s", "rv", cost=4, event_id="B")
    meter.void("A", "refund")
    assert used(meter, "rv") == [4]
    assert allowed_until_denied(meter, "rv") == 1


def test_a_reset_leaves_voids_of_past_windows_and_other_subjects_alone(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("s", "cal", cost=2, event_id="yesterday")
    meter.consume("t", "cal", cost=2, event_id="other-subject")
    clock.advance(days=1)
    meter.reset(subject="s", limit="cal")
    assert [c[2] for c in meter.void("yesterday", "refund").charges] == [2]
    assert [c[2] for c in meter.void("other-subject", "refund").charges] == [2]
    assert [c.used for c in meter.counters("s", "cal")] == [0]
    assert [c.used for c in meter.counters("t", "cal")] == [0]


# -- retention ----------------------------------------------------------------------


def test_a_correction_is_kept_as_long_as_its_result(meter: Meter, clock: FrozenClock) -> None:
    from metering.settings import RetentionPolicy
    from metering.upkeep.retention import prune

    meter.set_limit(Limit("big", maximum=100, period="1mo", window="calendar"))
    meter.consume("s", "big", cost=40, event_id="E")
    meter.void("E", "refund", correction_id="fix-E")
    meter.consume("s", "big", cost=30, event_id="F")
    clock.advance(hours=36)
    prune(meter, RetentionPolicy(results_days=1), visibility_timeout_seconds=300)
    assert meter.result("E") is not None  # inside the redelivery horizon
    again = meter.void("E", "refund", correction_id="fix-E")
    assert again.duplicate
    assert used(meter, "big") == [30]


def test_a_cancelled_reservation_is_kept_as_long_as_its_result(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("s", "cal", cost=2, event_id="base")
    meter.reserve("s", "cal", cost=3, event_id="r1")
    assert meter.cancel_reservation("r1") == 3
    clock.advance(hours=2)
    meter.sweep_reservations(retention_seconds=60)
    assert meter.reservation("r1") is not None
    with pytest.raises(CorrectionRefused):
        meter.void("r1", "refund")
    assert used(meter, "cal") == [2]


# -- settling the actual amount ------------------------------------------------------


def test_a_commit_of_less_gives_the_rest_back_once(meter: Meter) -> None:
    from metering.errors import ReservationSettled

    meter.consume("s", "rv", cost=1, event_id="base")
    held = meter.reserve("s", "rv", cost=3, event_id="r1")
    assert held.commit(actual=1) == 2
    assert used(meter, "rv") == [2]
    assert held.commit(actual=1) == 0  # committing twice does nothing
    assert meter.commit_reservation("r1", actual=0) == 0
    with pytest.raises(ReservationSettled):
        meter.cancel_reservation("r1")
    # A void reverses only what stayed charged: the 1 unit.
    assert [c[2] for c in meter.void("r1", "refund").charges] == [1]
    assert used(meter, "rv") == [1]
    assert allowed_until_denied(meter, "rv") == 4


def test_a_commit_of_less_gives_grants_back_last_drawn_first(meter: Meter) -> None:
    meter.grant("s", "rv", 4, grant_id="top-up")
    meter.consume("s", "rv", cost=4, event_id="base")
    meter.reserve("s", "rv", cost=3, event_id="r1")  # 1 own, 2 from the grant
    assert [g.used for g in meter.grants("s", "rv")] == [2]
    assert meter.commit_reservation("r1", actual=2) == 1
    assert [g.used for g in meter.grants("s", "rv")] == [1]
    assert used(meter, "rv") == [6]
    assert allowed_until_denied(meter, "rv") == 3  # 5 + 4 - 6


def test_a_commit_of_a_bad_actual_is_refused_and_changes_nothing(meter: Meter) -> None:
    from metering.errors import InvalidInput

    meter.reserve("s", "rv", cost=3, event_id="r1")
    for bad in (10**12 + 1, -1, 1.5, True, "2"):
        with pytest.raises(InvalidInput, match="actual"):
            meter.commit_reservation("r1", actual=bad)  # type: ignore[arg-type]
    info = meter.reservation("r1")
    assert info is not None and info.state == "held"
    assert used(meter, "rv") == [3]
    assert meter.commit_reservation("r1", actual=3) == 0
    assert used(meter, "rv") == [3]


def test_a_commit_of_less_past_the_time_to_live_stands_in_full(
    meter: Meter, clock: FrozenClock
) -> None:
    from metering.errors import ReservationExpired

    held = meter.reserve("s", "rv", cost=3, event_id="r1", ttl_seconds=30)
    clock.advance(seconds=31)
    with pytest.raises(ReservationExpired):
        held.commit(actual=1)
    assert held.state == "committed"
    assert used(meter, "rv") == [3]


def test_a_commit_of_less_after_a_reset_gives_the_new_window_nothing(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.reserve("s", "cal", cost=5, event_id="r1")
    clock.advance(seconds=1)
    meter.reset(subject="s", limit="cal")
    meter.consume("s", "cal", cost=5, event_id="B")
    assert meter.commit_reservation("r1", actual=1) == 0
    assert used(meter, "cal") == [5]
    assert allowed_until_denied(meter, "cal") == 0


@pytest.mark.slow
def test_settling_races_give_back_exactly_once(pg_url: str) -> None:
    """Per reservation, a commit of 1, a cancel, a commit in full and a sweep
    race in threads; exactly one settles it, and the counter is what the
    settled ledger says."""
    from concurrent.futures import ThreadPoolExecutor

    from metering.errors import ReservationSettled

    clock = FrozenClock(T0)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limit(Limit("big", maximum=100_000, period="1d", window="calendar"))
        ids = [f"r{n}" for n in range(40)]
        for reservation_id in ids:
            meter.reserve("s", "big", cost=3, event_id=reservation_id)

        def settle(job: tuple[str, str]) -> None:
            reservation_id, how = job
            try:
                if how == "less":
                    meter.commit_reservation(reservation_id, actual=1)
                elif how == "cancel":
                    meter.cancel_reservation(reservation_id)
                elif how == "full":
                    meter.commit_reservation(reservation_id)
                else:
                    meter.sweep_reservations()
            except ReservationSettled:
                pass

        jobs = [(r, how) for r in ids for how in ("less", "cancel", "full", "sweep")]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(settle, jobs))
        expected = 0
        for reservation_id in ids:
            info = meter.reservation(reservation_id)
            assert info is not None and info.state in ("committed", "cancelled")
            if info.state == "committed":
                expected += 3 - info.given_back_of(info.charges[0])
        assert used(meter, "big") == [expected]
