"""`Meter.lease`: quota leases in one process, on both databases (frozen clock)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from lease_checks import counted, settled_usage

from metering import FrozenClock, Limit, Meter
from metering.domain.decisions import Decision
from metering.domain.reservations import ReservationState
from metering.reservations.leases import LeaseBook, LeasedReservation

START = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("api", maximum=100, period="1h", window="calendar"))
        yield m


def leased(decision_event_id: str | None) -> bool:
    return bool(decision_event_id and decision_event_id.startswith("lease-"))


def test_one_process_denies_where_the_exact_path_denies(meter: Meter) -> None:
    """Same requests, one key through leases and one through consume: the same
    verdicts and the same figures, request by request."""
    for _ in range(130):
        exact = meter.consume("exact", "api")
        lease = meter.lease("leased", "api")
        assert (lease.allowed, lease.remaining, lease.used) == (
            exact.allowed,
            exact.remaining,
            exact.used,
        )
        assert lease.resets_at == exact.resets_at
    assert counted(meter, "leased", "api") == 100
    meter.settle_leases(everything=True)
    assert counted(meter, "leased", "api") == settled_usage(meter, "leased", "api") == 100
    # Denials took the exact path: each is recorded as the exact path records it.
    [leased_counter], [exact_counter] = (
        meter.counters("leased", "api"),
        meter.counters("exact", "api"),
    )
    assert leased_counter.denied_count == exact_counter.denied_count == 30


def test_a_cold_key_takes_the_exact_path_and_a_hot_one_doubles(
    meter: Meter, clock: FrozenClock
) -> None:
    firsts = [meter.lease("ada", "api") for _ in range(7)]
    assert not any(leased(d.event_id) for d in firsts)  # cold: consume
    ids = [meter.lease("ada", "api").event_id for _ in range(14)]
    blocks = [ids.count(i) for i in dict.fromkeys(ids)]
    assert blocks == [2, 4, 8]  # hot from the eighth request: 7 + 2 + 4 + 8 = 21
    assert sorted(r.charges[0].cost for r in meter.reservations(subject="ada")) == [2, 4, 8]
    clock.advance(seconds=2)  # idle: cold again, the lease is settled
    meter.settle_leases()
    assert not leased(meter.lease("ada", "api").event_id)
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 22
    assert all(r.state == ReservationState.COMMITTED for r in meter.reservations(subject="ada"))


def test_an_idle_lease_gives_its_unused_units_back(meter: Meter, clock: FrozenClock) -> None:
    for _ in range(10):  # 7 exact, then a block of 2, then a block of 4 (one used)
        meter.lease("ada", "api")
    assert counted(meter, "ada", "api") == 13  # the whole block counts as used
    clock.advance(seconds=0.5)
    meter.settle_leases()  # the spent block of 2 (nothing to give back)
    assert counted(meter, "ada", "api") == 13  # the block of 4 is not idle yet
    clock.advance(seconds=0.5)
    meter.settle_leases()  # (or the book's thread did)
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 10
    by_cost = {r.charges[0].cost: r for r in meter.reservations(subject="ada")}
    assert by_cost[4].state == ReservationState.COMMITTED
    assert by_cost[4].given_back_of(by_cost[4].charges[0]) == 3


def test_a_lease_never_outlives_its_window(meter: Meter, clock: FrozenClock) -> None:
    clock.set(datetime(2026, 11, 22, 12, 59, 57, tzinfo=UTC))  # 3 s before the window ends
    for _ in range(9):  # 7 exact, a block of 2
        meter.lease("ada", "api")
    [lease] = meter.reservations(subject="ada")  # the block of 2
    assert lease.expires_at == datetime(2026, 11, 22, 13, 0, tzinfo=UTC)
    clock.set(datetime(2026, 11, 22, 12, 59, 59, tzinfo=UTC))  # its serving time is over
    decision = meter.lease("ada", "api")
    assert not leased(decision.event_id)
    meter.settle_leases()
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 10
    clock.set(datetime(2026, 11, 22, 12, 59, 59, 500_000, tzinfo=UTC))  # half a second left
    for _ in range(5):
        assert not leased(meter.lease("ada", "api").event_id)  # too late to lease


def test_leases_of_two_processes_never_exceed_the_maximum(db_url: str, clock: FrozenClock) -> None:
    """Two meters on one database stand for two processes: they interleave,
    and neither is ever allowed what the other holds."""
    with Meter(db_url, clock=clock) as one, Meter(db_url, clock=clock) as two:
        one.set_limit(Limit("api", maximum=100, period="1h", window="calendar"))
        allowed = 0
        for _ in range(80):
            for meter in (one, two, two):
                allowed += meter.lease("ada", "api").allowed
                assert counted(one, "ada", "api") <= 100
        assert allowed == 100  # each ended with its lease spent: nothing lost
        one.settle_leases(everything=True)
        two.settle_leases(everything=True)
        assert counted(one, "ada", "api") == settled_usage(one, "ada", "api") == 100


def test_a_stacked_reservation_from_a_lease_goes_back_to_it(meter: Meter) -> None:
    for _ in range(8):
        meter.lease("ada", "api")  # 7 exact, a block of 2: one left
    held = meter.lease_reservation("ada", "api")
    assert isinstance(held, LeasedReservation)
    assert held.state == ReservationState.HELD and held.decision.remaining == 91
    assert held.cancel() == 1
    assert held.cancel() == 0  # once
    again = meter.lease_reservation("ada", "api")
    assert isinstance(again, LeasedReservation)
    again.commit()
    assert again.state == ReservationState.COMMITTED
    meter.settle_leases(everything=True)
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 9


def test_a_reservation_held_when_the_lease_settles_counts_as_used(meter: Meter) -> None:
    for _ in range(9):
        meter.lease("ada", "api")  # 7 exact, a block of 2 spent
    meter.lease("ada", "api")  # a block of 4, 3 left
    held = meter.lease_reservation("ada", "api")
    meter.settle_leases(everything=True)
    assert held.cancel() == 0  # too late: the lease counted it as used
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 11


def test_token_buckets_and_soft_limits_are_not_leased(meter: Meter) -> None:
    meter.set_limit(Limit("bucket", maximum=50, period="1m", algorithm="token_bucket"))
    meter.set_limit(Limit("soft", maximum=5, period="1h", enforcement="soft"))
    for name in ("bucket", "soft"):
        decisions = [meter.lease("ada", name) for _ in range(20)]
        assert not any(leased(d.event_id) for d in decisions)
    assert meter.reservations(subject="ada") == []


def test_a_block_that_no_longer_fits_records_nothing(db_url: str, clock: FrozenClock) -> None:
    """One meter saw 80 left; another took them meanwhile. The first one's
    block is refused without a trace and its request takes the exact path."""
    with Meter(db_url, clock=clock) as one, Meter(db_url, clock=clock) as two:
        one.set_limit(Limit("api", maximum=100, period="1h", window="calendar"))
        for _ in range(20):
            one.consume("ada", "api")
        for _ in range(7):
            one.lease("ada", "api")  # cold: exact; it now believes 73 are left
        for _ in range(73):
            two.consume("ada", "api")
        decision = one.lease("ada", "api")  # a block of 2 does not fit
        assert not decision.allowed and not leased(decision.event_id)
        [counter] = one.counters("ada", "api")
        assert (counter.used, counter.denied_count, counter.denied_cost) == (100, 1, 1)
        assert one.reservations(subject="ada") == []


def test_the_book_keeps_a_bounded_number_of_keys(meter: Meter) -> None:
    """A hundred times its capacity in distinct keys: the book never holds more
    than its capacity."""
    book = LeaseBook(meter._engine, capacity=1000)
    decision = meter.consume("seed", "api")
    for number in range(100_000):
        book.note(f"client-{number}", "api", 1, decision)
        if number % 10_000 == 0:
            assert len(book) <= 1000
    assert len(book) == 1000


def test_a_key_pushed_out_of_the_book_has_its_lease_settled(
    meter: Meter, clock: FrozenClock
) -> None:
    book = LeaseBook(meter._engine, capacity=2)
    for _ in range(9):
        book.lease("ada", "api", 1)  # 7 exact, a block of 2 spent
    book.lease("ada", "api", 1)  # a block of 4, one used
    for other in ("bob", "cy"):
        book.lease(other, "api", 1)
    assert len(book) == 2
    book.settle_due()  # ada's lease, pushed out (or the book's thread did)
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 10
    clock.advance(timedelta(seconds=1))
    book.close()


def test_a_hot_keys_next_block_is_leased_before_its_lease_ends(
    meter: Meter, clock: FrozenClock
) -> None:
    """The book's thread leases the next block in the last second of a lease's
    serving time; the first request after it is served from memory."""
    meter.set_limit(Limit("big", maximum=1000, period="1h", window="calendar"))
    ids = [meter.lease("ada", "big").event_id for _ in range(70)]  # ... a block of 64
    current = ids[-1]
    for _ in range(16):  # 3.2 s on, hot (5 requests a second): it serves until 4 s
        clock.advance(seconds=0.2)
        assert meter.lease("ada", "big").event_id == current
    meter.leases.renew_ahead()  # (or the book's thread did)
    clock.advance(seconds=0.8)
    decision = meter.lease("ada", "big")
    assert leased(decision.event_id) and decision.event_id != current
    # Blocks 7 + 2 + 4 + 8 + 16 + 32 + 64 + 34 (twice the 17 used): 167 counted,
    # 33 of the last held.
    assert decision.remaining == 1000 - 167 + 33
    meter.settle_leases(everything=True)
    assert counted(meter, "ada", "big") == settled_usage(meter, "ada", "big") == 87


def test_units_a_replaced_lease_still_holds_count_before_the_last_denial(
    meter: Meter, clock: FrozenClock
) -> None:
    """A lease replaced with units left is settled in the background; a
    client that then runs into its limit gets every unit all the same."""
    allowed = sum(meter.lease("ada", "api").allowed for _ in range(22))  # ... a block of 16
    for step in (0.9, 0.9, 0.9, 0.9):
        clock.advance(seconds=step)
        allowed += meter.lease("ada", "api").allowed
    clock.advance(seconds=0.5)  # the block of 16 (11 unused) has stopped serving
    for _ in range(200):
        allowed += meter.lease("ada", "api").allowed
    assert allowed == 100
    meter.settle_leases(everything=True)
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 100


def test_a_settlement_that_hangs_does_not_hold_back_the_next_block(
    meter: Meter, clock: FrozenClock
) -> None:
    """The book's threads renew and settle apart: with bob's settlement stuck
    (a slow transaction), ada's next block is still leased ahead, so her
    requests do not wait for a renewal (they did when one thread did both)."""
    import threading
    import time

    meter.set_limit(Limit("big", maximum=1000, period="1h", window="calendar"))
    for _ in range(12):
        meter.lease("bob", "big")  # hot: bob holds a block
    for _ in range(70):
        meter.lease("ada", "big")
    stuck = threading.Event()
    settle = meter.commit_reservation

    def slow_commit(reservation_id: str, actual: int | None = None) -> int:
        stuck.wait(30)
        return settle(reservation_id, actual)

    meter.commit_reservation = slow_commit  # type: ignore[method-assign]
    try:
        for _ in range(16):  # bob idle for 3.2 s: due; ada hot, in her last second
            clock.advance(seconds=0.2)
            meter.lease("ada", "big")
        key = meter.leases._keys[("ada", "big")]
        deadline = time.monotonic() + 20
        while key.next is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the book's threads run every quarter second
        assert key.next is not None
    finally:
        stuck.set()
        meter.commit_reservation = settle  # type: ignore[method-assign]
    meter.settle_leases(everything=True)
    assert counted(meter, "ada", "big") == settled_usage(meter, "ada", "big") == 86


def test_a_call_that_finds_the_lease_renewed_meanwhile_is_served_from_it(
    meter: Meter,
) -> None:
    """Two calls find a key's lease spent; the first renews it; the second,
    whose renewal starts after that, is served from the new block instead of
    replacing it (which held its unused units back from everyone until the
    book's thread settled it, and lost them if the process was killed before:
    units that `held_units` did not count)."""
    book = meter.leases
    for _ in range(13):  # 7 exact, a block of 2, a block of 4: spent
        assert meter.lease("ada", "api").allowed
    take = book.take
    others: list[Decision] = []

    def another_call_renews_meanwhile(subject: str, limit: str, cost: int) -> Decision | None:
        decision = take(subject, limit, cost)
        if decision is None:
            book.take = take  # type: ignore[method-assign]
            others.append(meter.lease(subject, limit, cost))  # a block of 8
        return decision

    book.take = another_call_renews_meanwhile  # type: ignore[method-assign]
    try:
        decision = meter.lease("ada", "api")
    finally:
        book.take = take  # type: ignore[method-assign]
    [other] = others
    assert leased(other.event_id) and decision.allowed and decision.event_id == other.event_id
    # What the database counts is what was served and what the book holds.
    assert counted(meter, "ada", "api") == 15 + book.held_units() == 21
    meter.settle_leases(everything=True)
    assert counted(meter, "ada", "api") == settled_usage(meter, "ada", "api") == 15


def test_a_change_notice_drops_its_keys_leases_at_once(meter: Meter) -> None:
    meter.set_limit(Limit("hard", maximum=1000, period="1h", window="calendar"))
    for subject in ("org-1", "org-2"):
        for _ in range(40):
            meter.lease(subject, "hard")
    book = meter.leases
    assert book.held_units() > 0
    held_elsewhere = sum(
        lease.unused for _, (name, lease) in book._open.items() if name[0] == "org-2"
    )
    book.changed("org-1", None)  # as the listener passes on a reset of org-1
    assert book.notices == 1
    assert not leased(meter.lease("org-1", "hard").event_id)  # the exact path decides
    assert leased(meter.lease("org-2", "hard").event_id)  # another key keeps its lease
    assert book.held_units() == held_elsewhere - 1
    book.changed(None, None)  # every key (the listener reconnected)
    assert book.held_units() == 0
    assert not leased(meter.lease("org-2", "hard").event_id)
    meter.settle_leases(everything=True)
    for subject in ("org-1", "org-2"):
        assert counted(meter, subject, "hard") == settled_usage(meter, subject, "hard")
