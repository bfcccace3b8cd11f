"""The pure rules of quota leases (`metering.domain.leases`), with a frozen clock."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from metering.clock import FrozenClock
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.instants import to_us
from metering.domain.leases import (
    HOT_STREAK,
    HOT_US,
    LEASE_US,
    MAX_BLOCK_UNITS,
    SERVE_US,
    SETTLE_MARGIN_US,
    Block,
    block_units,
    is_hot,
    leasable,
    lease_times,
    recent,
    served_charge,
    served_decision,
    streak_after,
)
from metering.domain.limits import Limit


def test_a_cold_key_leases_only_its_cost(clock: FrozenClock) -> None:
    now_us = to_us(clock())
    assert streak_after(0, None, now_us) == 1  # never seen
    assert not is_hot(1)
    assert block_units(used_before=64, hot=False, left=10_000, cost=1) == 1
    assert block_units(used_before=64, hot=False, left=10_000, cost=5) == 5


def test_a_streak_is_requests_less_than_a_second_apart(clock: FrozenClock) -> None:
    seen_us = to_us(clock())
    clock.advance(seconds=0.999999)
    assert recent(seen_us, to_us(clock()))
    assert streak_after(2, seen_us, to_us(clock())) == 3
    clock.advance(timedelta(microseconds=1))
    assert to_us(clock()) - seen_us == HOT_US
    assert not recent(seen_us, to_us(clock()))
    assert streak_after(7, seen_us, to_us(clock())) == 1  # a second apart: it starts over
    assert not recent(seen_us + 5, seen_us)  # a clock that went back: cold


def test_a_key_is_hot_from_its_eighth_request_in_a_streak(clock: FrozenClock) -> None:
    streak, last_us = 0, None
    hot = []
    for _ in range(10):
        now_us = to_us(clock())
        streak = streak_after(streak, last_us, now_us)
        hot.append(is_hot(streak))
        last_us = now_us
        clock.advance(seconds=0.9)
    assert HOT_STREAK == 8
    assert hot == [False] * 7 + [True] * 3


def test_the_block_doubles_while_the_key_stays_hot() -> None:
    blocks, used = [], 1  # the first request took the exact path
    for _ in range(8):
        used = block_units(used, hot=True, left=10**9, cost=1)
        blocks.append(used)  # each block spent in full
    assert blocks == [2, 4, 8, 16, 32, 64, 128, 256]
    # A block used only in part doubles what was used, not the block.
    assert block_units(used_before=10, hot=True, left=10**9, cost=1) == 20


def test_a_block_is_at_most_a_quarter_of_what_is_left() -> None:
    assert block_units(used_before=512, hot=True, left=1000, cost=1) == 250
    assert block_units(used_before=512, hot=True, left=401, cost=1) == 100
    assert block_units(used_before=10**6, hot=True, left=10**12, cost=1) == MAX_BLOCK_UNITS


@given(
    used_before=st.integers(0, 10**6),
    hot=st.booleans(),
    left=st.integers(0, 10**9),
    cost=st.integers(1, 1000),
)
def test_the_block_rule_bounds(used_before: int, hot: bool, left: int, cost: int) -> None:
    units = block_units(used_before, hot, left, cost)
    assert units >= cost
    if units > cost:  # a block in bulk
        assert hot
        assert 4 * units <= left
        assert units <= max(2 * used_before, cost)
        assert units <= MAX_BLOCK_UNITS


def test_the_last_units_of_a_window_are_never_leased_in_bulk() -> None:
    for left in range(8):
        assert block_units(used_before=4096, hot=True, left=left, cost=1) == 1
    assert block_units(used_before=4096, hot=True, left=8, cost=1) == 2
    for left in range(40):  # cost 5: fewer than 4 * 6 left is one request at a time
        units = block_units(used_before=4096, hot=True, left=left, cost=5)
        assert units == (5 if left < 24 else left // 4)


def test_a_lease_lives_a_few_seconds_and_never_past_its_window(clock: FrozenClock) -> None:
    now_us = to_us(clock())
    far = now_us + 3600 * 1_000_000
    assert lease_times(now_us, far) == (now_us + LEASE_US, now_us + SERVE_US)
    assert SERVE_US + SETTLE_MARGIN_US < LEASE_US  # settled well before it expires
    near = now_us + 3 * 1_000_000
    assert lease_times(now_us, near) == (near, near - SETTLE_MARGIN_US)
    # Less than the settling margin left of the window: no lease at all.
    assert lease_times(now_us, now_us + SETTLE_MARGIN_US) is None
    assert lease_times(now_us, now_us + 1) is None


def test_only_hard_fixed_windows_are_leased() -> None:
    assert leasable(Limit("a", maximum=10, period="1m"))
    assert leasable(Limit("a", maximum=10, period="1mo", window="calendar"))
    assert not leasable(Limit("a", maximum=10, period="1m", algorithm="token_bucket"))
    assert not leasable(Limit("a", maximum=10, period="1m", enforcement="soft"))
    assert not leasable(Limit("a", maximum=10, period="1m", enforcement="shadow"))


def test_a_request_from_a_lease_counts_other_leases_as_used(clock: FrozenClock) -> None:
    now_us = to_us(clock())
    # The block of 8 was leased when others had used or held 50 of 100:
    # the database counts 58 used, 42 remaining.
    charge = ChargeDecision(
        "ada", "api", 8, True, "allowed", 58, 42, 100, 0, now_us, now_us + 60_000_000, None
    )
    block = Block("lease-1", 8, charge, now_us + 4_000_000)
    first = served_charge(block, cost=1, unused=7)
    assert (first.used, first.remaining, first.cost) == (51, 49, 1)
    last = served_charge(block, cost=1, unused=0)
    assert (last.used, last.remaining) == (58, 42)  # what the exact path says then
    assert last.resets_at_us == charge.resets_at_us
    assert last.window_start_us == charge.window_start_us
    assert last.allowed and last.outcome == "allowed" and last.retry_at_us is None


def test_a_request_served_from_a_lease_is_an_allowed_decision_of_the_lease(
    clock: FrozenClock,
) -> None:
    now = clock()
    now_us = to_us(now)
    charge = ChargeDecision(
        "ada", "api", 8, True, "allowed", 58, 42, 100, 3, now_us, now_us + 60_000_000, None
    )
    block = Block("lease-1", 8, charge, now_us + 4_000_000)
    served = ChargeDecision(
        subject="ada",
        limit="api",
        cost=2,
        allowed=True,
        outcome="allowed",
        used=53,
        remaining=47,
        maximum=100,
        overage=0,
        window_start_us=now_us,
        resets_at_us=now_us + 60_000_000,
        retry_at_us=None,
    )
    assert served_charge(block, cost=2, unused=5) == served
    assert served_decision(block, 2, 5, now) == Decision(
        event_id="lease-1",
        outcome="allowed",
        charges=(served,),
        occurred_at=now,
        decided_at=now,
    )


def test_a_request_at_the_same_instant_continues_the_streak() -> None:
    assert recent(1_000, 1_000)
    assert streak_after(3, 1_000, 1_000) == 4
