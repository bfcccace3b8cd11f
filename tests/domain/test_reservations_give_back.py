"""Cancelling a reservation gives its cost back (`domain/reservations.py`).

A fixed window takes the cost back while it is current; a token bucket
takes the tokens back up to its capacity. Nothing else changes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from metering.domain.buckets import evaluate_bucket
from metering.domain.corrections import (
    Reset,
    VoidedCharge,
    can_take_back,
    counter_of,
    not_reset,
    split_back,
    still_charged,
    take_back,
    taken_back,
)
from metering.domain.limits import Limit
from metering.domain.reservations import (
    STORED_STATES,
    GiveBack,
    HeldCharge,
    ReservationState,
    can_give_back,
    give_back,
)
from metering.domain.state import NO_WINDOW, CounterKey, CounterState

SECOND = 1_000_000
T0 = 1_800_000_000 * SECOND
WINDOW = Limit("calls", maximum=10, period="1m")
BUCKET = Limit("api", maximum=4, period="4s", algorithm="token_bucket")  # a token a second
IN_WINDOW = HeldCharge("org", "calls", 3, T0, T0 + 60 * SECOND)
IN_BUCKET = HeldCharge("org", "api", 3, NO_WINDOW, NO_WINDOW)


def exact(back: GiveBack) -> bool:
    """Whole numbers only: instants times a capacity exceed what a float holds exactly."""
    values = (back.returned, back.state.used, back.state.tat_us, back.state.tat_rem)
    return all(type(v) is int for v in values)


def took(limit: Limit, cost: int, at_us: int, state: CounterState | None = None) -> CounterState:
    evaluation = evaluate_bucket(limit, state or CounterState(), cost, at_us)
    assert evaluation.fits
    return evaluation.applied


# --------------------------------------------------------------------------- the held charge


def test_a_held_charge_round_trips_through_its_row() -> None:
    assert IN_WINDOW.to_row() == ["org", "calls", 3, T0, T0 + 60 * SECOND]
    assert HeldCharge.from_row(IN_WINDOW.to_row()) == IN_WINDOW
    assert IN_WINDOW.key == CounterKey("calls", "org", T0, T0 + 60 * SECOND)


def test_a_held_charge_from_a_json_row_gets_its_types_back() -> None:
    row: list[object] = ["org", "calls", "3", str(T0), float(T0 + 60 * SECOND)]
    charge = HeldCharge.from_row(row)
    assert charge == IN_WINDOW
    assert [type(v) for v in charge.to_row()] == [str, str, int, int, int]


def test_reservation_states_are_their_names() -> None:
    assert [str(s) for s in ReservationState] == ["held", "committed", "cancelled", "denied"]
    assert ReservationState.DENIED not in STORED_STATES and len(STORED_STATES) == 3


# --------------------------------------------------------------------------- whether


def test_nothing_goes_back_to_a_limit_deleted_since() -> None:
    assert not can_give_back(None, IN_WINDOW, T0)


@pytest.mark.parametrize(
    ("limit", "charge"),
    [(BUCKET, IN_WINDOW), (WINDOW, IN_BUCKET)],
    ids=["window became a bucket", "bucket became a window"],
)
def test_nothing_goes_back_to_a_limit_redefined_as_another_algorithm(
    limit: Limit, charge: HeldCharge
) -> None:
    assert not can_give_back(limit, charge, T0)
    state = CounterState(used=5, tat_us=T0 + 10 * SECOND)
    assert give_back(limit, charge, state, T0) == GiveBack(state, 0)


def test_a_window_takes_back_until_its_last_microsecond() -> None:
    end = IN_WINDOW.window_end_us
    assert can_give_back(WINDOW, IN_WINDOW, end - 1)
    assert not can_give_back(WINDOW, IN_WINDOW, end)


def test_a_bucket_can_always_take_back() -> None:
    assert can_give_back(BUCKET, IN_BUCKET, T0 + 10**9 * SECOND)


# --------------------------------------------------------------------------- windows


def test_a_current_window_gets_the_cost_back() -> None:
    state = CounterState(used=7, denied_count=2, denied_cost=5, first_denied_at_us=T0)
    assert give_back(WINDOW, IN_WINDOW, state, T0) == GiveBack(replace(state, used=4), 3)


def test_a_window_never_goes_below_zero() -> None:
    assert give_back(WINDOW, IN_WINDOW, CounterState(used=2), T0) == GiveBack(CounterState(), 2)


def test_an_ended_window_keeps_its_usage() -> None:
    state = CounterState(used=7)
    later = IN_WINDOW.window_end_us
    assert give_back(WINDOW, IN_WINDOW, state, later) == GiveBack(state, 0)


# --------------------------------------------------------------------------- buckets


def test_a_bucket_that_never_consumed_has_nothing_to_take_back() -> None:
    state = CounterState(used=3)
    assert give_back(BUCKET, IN_BUCKET, state, T0) == GiveBack(state, 0)


def test_a_bucket_gets_its_tokens_back_at_once() -> None:
    state = took(BUCKET, 3, T0)
    assert (state.used, state.tat_us) == (3, T0 + 3 * SECOND)
    back = give_back(BUCKET, replace(IN_BUCKET, cost=2), state, T0)
    assert back == GiveBack(replace(state, used=1, tat_us=T0 + SECOND, tat_rem=0, tat_scale=4), 2)
    # Three tokens are there again: the one still taken is the only one missing.
    assert evaluate_bucket(BUCKET, back.state, 3, T0).fits
    assert not evaluate_bucket(BUCKET, back.state, 4, T0).fits


def test_a_bucket_that_refilled_meanwhile_takes_back_only_the_missing_tokens() -> None:
    state = took(BUCKET, 3, T0)
    back = give_back(BUCKET, IN_BUCKET, state, T0 + 2 * SECOND)
    assert back.returned == 1
    assert back.state == replace(state, used=0, tat_us=T0 + 2 * SECOND, tat_rem=0, tat_scale=4)


def test_part_of_a_token_is_not_counted_as_returned() -> None:
    state = took(BUCKET, 3, T0)
    half = T0 + 2 * SECOND + SECOND // 2  # half a token is missing
    back = give_back(BUCKET, IN_BUCKET, state, half)
    assert back.returned == 0
    assert (back.state.used, back.state.tat_us, back.state.tat_rem) == (0, half, 0)


@pytest.mark.parametrize("later", [3 * SECOND, 9 * SECOND])
def test_a_full_bucket_takes_nothing_back(later: int) -> None:
    state = took(BUCKET, 3, T0)
    assert give_back(BUCKET, IN_BUCKET, state, T0 + later) == GiveBack(state, 0)


def test_a_bucket_keeps_the_fraction_of_a_token() -> None:
    thirds = Limit("api", maximum=3, period="1s", algorithm="token_bucket")  # 1/3 s a token
    state = took(thirds, 2, T0)
    assert (state.tat_us, state.tat_rem, state.tat_scale) == (T0 + 666_666, 2, 3)
    back = give_back(thirds, replace(IN_BUCKET, cost=1), state, T0)
    assert exact(back)
    assert back.returned == 1
    assert (back.state.tat_us, back.state.tat_rem, back.state.tat_scale) == (T0 + 333_333, 1, 3)


def test_a_bucket_written_under_another_capacity_takes_back_in_the_new_one() -> None:
    state = took(Limit("api", maximum=3, period="3s", algorithm="token_bucket"), 2, T0)
    assert (state.tat_us, state.tat_rem, state.tat_scale) == (T0 + 2 * SECOND, 0, 3)
    # Now 6 tokens over 3 s: half a second a token, so 2 s are 4 tokens missing.
    bigger = Limit("api", maximum=6, period="3s", algorithm="token_bucket")
    back = give_back(bigger, IN_BUCKET, state, T0)
    assert exact(back)
    assert back.returned == 3
    assert (back.state.tat_us, back.state.tat_rem, back.state.tat_scale) == (
        T0 + SECOND // 2,
        0,
        6,
    )
    assert back.state.used == 0


def test_an_exact_arrival_time_is_rounded_up_into_the_new_capacity() -> None:
    # Written under capacity 3: full at T0 + 1/3 µs. Under capacity 2 that is
    # 2/3 of a scaled unit, rounded up to one: the bucket is not full at T0.
    state = CounterState(used=1, tat_us=T0, tat_rem=1, tat_scale=3)
    two = Limit("api", maximum=2, period="2s", algorithm="token_bucket")
    back = give_back(two, IN_BUCKET, state, T0)
    assert exact(back)
    assert back.returned == 0
    assert (back.state.tat_us, back.state.tat_rem, back.state.tat_scale) == (T0, 0, 2)


# -- a void after a reset or a cancel (`domain/corrections.py`) ---------------------

WINDOW_KEY = CounterKey("calls", "org", T0, T0 + 60 * SECOND)
BUCKET_KEY = CounterKey("api", "org", NO_WINDOW, NO_WINDOW)


@pytest.mark.parametrize(
    ("reset", "cleared"),
    [
        (Reset("org", "calls", T0 + SECOND, T0), True),  # its very counter
        (Reset("org", "calls", T0 + 90 * SECOND, T0), True),  # timed after the window: still
        (Reset("org", "calls", T0 + SECOND, T0 + 60 * SECOND), False),  # the next window
        (Reset("other", "calls", T0 + SECOND, T0), False),
        (Reset("org", "other", T0 + SECOND, T0), False),
        # Recorded by earlier versions: every window open at its time, of
        # every subject or limit where it names none.
        (Reset("org", "calls", T0 + SECOND), True),
        (Reset(None, "calls", T0 + SECOND), True),
        (Reset("org", None, T0 + SECOND), True),
        (Reset(None, None, T0 + SECOND), True),
        (Reset("other", "calls", T0 + SECOND), False),
        (Reset("org", "calls", T0 + 60 * SECOND - 1), True),  # the window still open
        (Reset("org", "calls", T0 + 60 * SECOND), False),  # over: not cleared
    ],
)
def test_a_reset_written_after_an_event_clears_its_counter(reset: Reset, cleared: bool) -> None:
    assert reset.cleared(WINDOW_KEY) is cleared


def test_a_reset_clears_a_bucket_of_its_scope() -> None:
    assert Reset("org", "api", T0 + 10**12, NO_WINDOW).cleared(BUCKET_KEY)
    assert Reset("org", "api", T0 + 10**12).cleared(BUCKET_KEY)
    assert not Reset("org", "calls", T0).cleared(BUCKET_KEY)


def test_a_void_skips_what_a_reset_or_a_cancel_gave_back() -> None:
    window = VoidedCharge(WINDOW_KEY, 3, ())
    bucket = VoidedCharge(BUCKET_KEY, 2, ())
    resets = [Reset(None, "api", T0 + 5)]
    assert not_reset([window, bucket], resets) == [window]
    assert not_reset([window, bucket], []) == [window, bucket]
    assert counter_of(WINDOW_KEY) == ("org", "calls", T0)
    assert still_charged([window, bucket], [("org", "calls", T0, 3)]) == [bucket]
    assert still_charged([window, bucket], [("org", "calls", T0 + 1, 3)]) == [window, bucket]
    assert still_charged([window], [("org", "calls", T0, 2)]) == [VoidedCharge(WINDOW_KEY, 1, ())]


@pytest.mark.parametrize(
    ("units", "back", "stays"),
    [
        (0, (0, ()), (6, (("g1", 2), ("g2", 3)))),
        (2, (2, (("g2", 2),)), (4, (("g1", 2), ("g2", 1)))),
        (3, (3, (("g2", 3),)), (3, (("g1", 2),))),
        (4, (4, (("g1", 1), ("g2", 3))), (2, (("g1", 1),))),
        (5, (5, (("g1", 2), ("g2", 3))), (1, ())),
        (6, (6, (("g1", 2), ("g2", 3))), (0, ())),
        (9, (6, (("g1", 2), ("g2", 3))), (0, ())),
        (-1, (0, ()), (6, (("g1", 2), ("g2", 3)))),
    ],
)
def test_what_goes_back_is_the_last_drawn_first(
    units: int,
    back: tuple[int, tuple[tuple[str, int], ...]],
    stays: tuple[int, tuple[tuple[str, int], ...]],
) -> None:
    """Own allowance 1, then grant g1 paid 2 and g2 paid 3: grants go back first, g2 before g1."""
    charge = VoidedCharge(WINDOW_KEY, 6, (("g1", 2), ("g2", 3)))
    given, kept = split_back(charge, units)
    assert (given.cost, given.grants) == back
    assert (kept.cost, kept.grants) == stays
    assert given.key == kept.key == WINDOW_KEY


# -- one give-back for cancel and void (`take_back`, `taken_back`) ----------------

PAST_WINDOW = VoidedCharge(CounterKey("calls", "org", T0, T0 + 60 * SECOND), 3, ())
BUCKET_CHARGE = VoidedCharge(CounterKey("api", "org", NO_WINDOW, NO_WINDOW), 3, ())


def test_a_cancel_gives_a_past_window_nothing_and_a_void_takes_it_back() -> None:
    later = T0 + 61 * SECOND
    state = CounterState(used=5, denied_count=1)
    assert not can_take_back(WINDOW, PAST_WINDOW, later, past_windows=False)
    assert can_take_back(WINDOW, PAST_WINDOW, T0, past_windows=False)
    assert can_take_back(None, PAST_WINDOW, later, past_windows=True)
    assert not can_take_back(None, PAST_WINDOW, T0, past_windows=False)
    assert take_back(WINDOW, PAST_WINDOW, state, later, past_windows=False) == GiveBack(state, 0)
    assert take_back(WINDOW, PAST_WINDOW, state, later, past_windows=True) == GiveBack(
        replace(state, used=2), 3
    )
    assert take_back(WINDOW, PAST_WINDOW, state, T0, past_windows=False) == GiveBack(
        replace(state, used=2), 3
    )
    assert take_back(None, PAST_WINDOW, state, T0, past_windows=False) == GiveBack(state, 0)


def test_a_bucket_takes_tokens_back_the_same_under_cancel_and_void() -> None:
    state = took(BUCKET, 4, T0)  # empty at T0
    for past_windows in (False, True):
        taken = take_back(BUCKET, BUCKET_CHARGE, state, T0, past_windows=past_windows)
        held = give_back(BUCKET, IN_BUCKET, state, T0)
        assert taken == held and taken.returned == 3


def test_charges_sharing_a_counter_give_back_in_turn() -> None:
    other = VoidedCharge(PAST_WINDOW.key, 4, ())
    states = {PAST_WINDOW.key: CounterState(used=5)}
    changed, returned = taken_back(
        {"calls": WINDOW}, [PAST_WINDOW, other], states, T0, past_windows=False
    )
    assert changed == {PAST_WINDOW.key: CounterState(used=0)}
    assert returned == [3, 2]
    fresh, units = taken_back({}, [PAST_WINDOW], {}, T0, past_windows=True)
    assert fresh == {PAST_WINDOW.key: CounterState()} and units == [0]


def test_a_void_takes_back_from_an_ended_window_even_of_a_deleted_limit() -> None:
    states = {PAST_WINDOW.key: CounterState(used=5)}
    changed, returned = taken_back({}, [PAST_WINDOW], states, T0, past_windows=True)
    assert changed == {PAST_WINDOW.key: CounterState(used=5 - PAST_WINDOW.cost)}
    assert returned == [PAST_WINDOW.cost]
