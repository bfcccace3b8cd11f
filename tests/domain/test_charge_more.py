"""A commit of more than was reserved charges the excess (`domain/reservations.py`).

The excess lands on the reservation's own counter whether it fits or not:
a window draws on grants first and counts what its own allowance and the
grants cannot pay as overage (soft) or overdraft (hard); a token bucket
takes the tokens anyway and goes into debt (`buckets.take_anyway`).
"""

from __future__ import annotations

from metering.domain.buckets import evaluate_bucket, take_anyway
from metering.domain.decisions import ChargeDecision
from metering.domain.grants import Balance, Pot
from metering.domain.limits import Limit
from metering.domain.reservations import (
    ChargedMore,
    HeldCharge,
    charge_more,
    held_charge,
    ruleless,
)
from metering.domain.state import NO_WINDOW, CounterState

SECOND = 1_000_000
T0 = 1_800_000_000 * SECOND
BUCKET = Limit("api", maximum=4, period="4s", algorithm="token_bucket")  # a token a second
THIRDS = Limit(
    "api", maximum=3, period="1s", algorithm="token_bucket"
)  # a token a third of a second
WINDOW = Limit("calls", maximum=10, period="1m")
SOFT = Limit("calls", maximum=10, period="1m", enforcement="soft")
SHADOW = Limit("calls", maximum=10, period="1m", enforcement="shadow")
SHADOW_BUCKET = Limit("api", maximum=4, period="4s", algorithm="token_bucket", enforcement="shadow")
IN_WINDOW = HeldCharge("org", "calls", 3, T0, T0 + 60 * SECOND)
IN_BUCKET = HeldCharge("org", "api", 3, NO_WINDOW, NO_WINDOW)


def grant(left: int, *, starts_us: int = T0 - SECOND, grant_id: str = "g1") -> Balance:
    return Balance(grant_id, left, 0, starts_us, None)


# --------------------------------------------------------------------------- take_anyway


def test_taking_from_a_full_bucket_moves_its_arrival_time_by_the_tokens() -> None:
    state, available = take_anyway(BUCKET, CounterState(used=2), 3, T0)
    assert available == 4
    assert state == CounterState(used=5, tat_us=T0 + 3 * SECOND, tat_rem=0, tat_scale=4)


def test_taking_keeps_the_exact_fraction_of_a_microsecond() -> None:
    state, available = take_anyway(THIRDS, CounterState(), 1, T0)
    assert available == 3
    # One token is a third of a second: 333_333 microseconds and 1/3.
    assert state == CounterState(used=1, tat_us=T0 + 333_333, tat_rem=1, tat_scale=3)
    state, available = take_anyway(THIRDS, state, 2, T0)
    assert available == 2
    assert state == CounterState(used=3, tat_us=T0 + SECOND, tat_rem=0, tat_scale=3)


def test_taking_more_than_the_bucket_holds_is_debt() -> None:
    state, available = take_anyway(BUCKET, CounterState(), 6, T0)
    assert available == 4
    assert state == CounterState(used=6, tat_us=T0 + 6 * SECOND, tat_rem=0, tat_scale=4)
    # In debt: nothing is available, not a negative number.
    again, available = take_anyway(BUCKET, state, 1, T0)
    assert available == 0
    assert again.tat_us == T0 + 7 * SECOND
    # The bucket refuses until it has refilled past the debt (two seconds).
    assert not evaluate_bucket(BUCKET, state, 1, T0 + 2 * SECOND).fits
    assert evaluate_bucket(BUCKET, state, 1, T0 + 3 * SECOND - 1).fits is False
    assert evaluate_bucket(BUCKET, state, 1, T0 + 3 * SECOND).fits


def test_taking_from_a_partly_refilled_bucket_counts_what_it_holds() -> None:
    state = CounterState(used=4, tat_us=T0 + 2 * SECOND, tat_scale=4)  # two tokens in use
    taken, available = take_anyway(BUCKET, state, 1, T0)
    assert available == 2
    assert taken == CounterState(used=5, tat_us=T0 + 3 * SECOND, tat_rem=0, tat_scale=4)
    # Long refilled: the arrival time starts from now, not from the past.
    taken, available = take_anyway(BUCKET, state, 1, T0 + 10 * SECOND)
    assert available == 4
    assert taken.tat_us == T0 + 11 * SECOND


# --------------------------------------------------------------------------- held_charge


def decision(window_start_us: int | None) -> ChargeDecision:
    return ChargeDecision(
        subject="org",
        limit="calls",
        cost=3,
        allowed=True,
        outcome="allowed",
        used=3,
        remaining=7,
        maximum=10,
        overage=0,
        window_start_us=window_start_us,
        resets_at_us=T0 + 60 * SECOND,
        retry_at_us=None,
    )


def test_a_window_charge_is_held_with_its_window() -> None:
    assert held_charge(decision(T0)) == HeldCharge("org", "calls", 3, T0, T0 + 60 * SECOND)


def test_a_bucket_charge_is_held_without_a_window() -> None:
    assert held_charge(decision(None)) == HeldCharge("org", "calls", 3, NO_WINDOW, NO_WINDOW)


# --------------------------------------------------------------------------- charge_more


def more(
    limit: Limit | None, charge: HeldCharge, extra: int, state: CounterState, **kw: object
) -> ChargedMore:
    return charge_more(limit, charge, extra, state, T0, maximum=10, **kw)  # type: ignore[arg-type]


def test_nothing_more_or_no_counter_charges_nothing() -> None:
    state = CounterState(used=3)
    assert more(None, IN_WINDOW, 5, state) == ChargedMore(state)
    assert more(BUCKET, IN_BUCKET, 0, CounterState()) == ChargedMore(CounterState())
    assert more(WINDOW, IN_WINDOW, 0, state) == ChargedMore(state)
    # Redefined since: a window charge on a bucket limit and the other way round.
    assert more(BUCKET, IN_WINDOW, 5, state) == ChargedMore(state)
    assert more(WINDOW, IN_BUCKET, 5, state) == ChargedMore(state)


def test_a_charge_whose_limit_is_gone_or_of_another_algorithm_has_no_rule() -> None:
    assert ruleless(None, IN_WINDOW) and ruleless(None, IN_BUCKET)
    assert ruleless(BUCKET, IN_WINDOW) and ruleless(WINDOW, IN_BUCKET)
    assert not ruleless(WINDOW, IN_WINDOW) and not ruleless(BUCKET, IN_BUCKET)


def test_one_unit_more_is_charged() -> None:
    assert more(WINDOW, IN_WINDOW, 1, CounterState(used=3)) == ChargedMore(CounterState(used=4))


def test_a_bucket_takes_the_excess_and_a_hard_one_counts_the_debt_as_overdraft() -> None:
    state = CounterState(used=3, tat_us=T0 + 3 * SECOND, tat_scale=4)  # one token left
    got = more(BUCKET, IN_BUCKET, 3, state)
    assert got == ChargedMore(
        CounterState(used=6, tat_us=T0 + 6 * SECOND, tat_rem=0, tat_scale=4), overdraft=2
    )
    assert more(BUCKET, IN_BUCKET, 1, state).overdraft == 0
    soft = more(SHADOW_BUCKET, IN_BUCKET, 3, state)
    assert soft == ChargedMore(got.state)


def test_a_window_charges_its_own_room_then_the_grants_then_overdraft() -> None:
    pot = Pot([grant(2)])
    got = more(WINDOW, IN_WINDOW, 5, CounterState(used=8), pot=pot)
    # 2 own units, 2 from the grant, 1 beyond both.
    assert got == ChargedMore(CounterState(used=13), (("g1", 2),), overage=0, overdraft=1)
    assert more(SOFT, IN_WINDOW, 5, CounterState(used=8), pot=Pot([grant(2)])) == ChargedMore(
        CounterState(used=13), (("g1", 2),), overage=1, overdraft=0
    )
    assert more(SHADOW, IN_WINDOW, 5, CounterState(used=8), pot=Pot([grant(2)])) == ChargedMore(
        CounterState(used=13), (("g1", 2),), overage=0, overdraft=0
    )


def test_grants_pay_even_when_the_excess_does_not_fit() -> None:
    got = more(WINDOW, IN_WINDOW, 10, CounterState(used=8), pot=Pot([grant(2)]))
    assert got == ChargedMore(CounterState(used=18), (("g1", 2),), overdraft=6)


def test_a_grant_not_yet_active_pays_nothing() -> None:
    later = Pot([grant(2, starts_us=T0 + 1)])
    got = more(WINDOW, IN_WINDOW, 5, CounterState(used=8), pot=later)
    assert got == ChargedMore(CounterState(used=13), (), overdraft=3)


def test_usage_paid_by_grants_is_not_the_windows_own() -> None:
    got = more(WINDOW, IN_WINDOW, 5, CounterState(used=8), granted=3)
    assert got == ChargedMore(CounterState(used=13))
    got = more(WINDOW, IN_WINDOW, 5, CounterState(used=8), granted=1)
    assert got == ChargedMore(CounterState(used=13), overdraft=2)


def test_only_the_new_overdraft_is_counted() -> None:
    got = more(WINDOW, IN_WINDOW, 2, CounterState(used=12))
    assert got == ChargedMore(CounterState(used=14), overdraft=2)
    got = charge_more(WINDOW, IN_WINDOW, 2, CounterState(used=12), T0, maximum=20)
    assert got == ChargedMore(CounterState(used=14))


def test_what_a_bucket_holds_is_whole_tokens() -> None:
    state = CounterState(used=2, tat_us=T0 + 2 * SECOND, tat_scale=4)
    # Half a second on, two and a half tokens are back: two are available.
    _, available = take_anyway(BUCKET, state, 1, T0 + SECOND // 2)
    assert available == 2
    assert type(available) is int
