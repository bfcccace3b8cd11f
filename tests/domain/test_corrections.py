"""Corrections (`domain/corrections.py`) to the unit: a void's reason, the
charges a void reverses, and what it takes back from a window or a bucket
(pinned where mutation testing found them unasserted).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from metering.domain.corrections import (
    VoidedCharge,
    split_held,
    take_back,
    taken_back,
    validate_reason,
    voided_charges,
)
from metering.domain.decisions import ChargeDecision
from metering.domain.limits import Limit
from metering.domain.reservations import HeldCharge
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.errors import InvalidInput

SECOND = 1_000_000


def test_a_reason_is_non_empty_printable_text_of_at_most_500_characters() -> None:
    assert validate_reason("x" * 500) == "x" * 500
    assert validate_reason(" duplicate ") == " duplicate "
    for bad in ("", "  ", None, 3):
        with pytest.raises(InvalidInput) as raised:
            validate_reason(bad)
        assert str(raised.value) == f"reason: must be a non-empty string, got {bad!r}"
    for bad in ("x" * 501, "tab\there", "line\n"):
        with pytest.raises(InvalidInput) as raised:
            validate_reason(bad)
        assert str(raised.value) == "reason: must be at most 500 printable characters"


def _stored(
    outcome: str, start: int | None, grants: tuple[tuple[str, int], ...] = ()
) -> list[object]:
    return ChargeDecision(
        subject="org",
        limit="calls",
        cost=4,
        allowed=outcome != "denied",
        outcome=outcome,  # type: ignore[arg-type]
        used=8,
        remaining=2,
        maximum=10,
        overage=0,
        window_start_us=start,
        resets_at_us=900,
        retry_at_us=None,
        grants=grants,
    ).to_row()


def test_a_void_reverses_each_charge_that_consumed_in_its_own_counter() -> None:
    rows = [
        _stored("allowed", 100, (("g", 1), ("h", 2))),
        _stored("would_deny", 100),
        _stored("overage", 300),
        _stored("denied", 100),
        _stored("allowed", None),
    ]
    expected = [
        VoidedCharge(CounterKey("calls", "org", 100, 900), 4, (("g", 1), ("h", 2))),
        VoidedCharge(CounterKey("calls", "org", 300, 900), 4, ()),
        VoidedCharge(CounterKey("calls", "org", NO_WINDOW, NO_WINDOW), 4, ()),
    ]
    assert voided_charges("allowed", rows) == expected
    assert voided_charges("overage", rows) == expected
    assert voided_charges("denied", rows) == []
    assert voided_charges("rejected", rows) == []


def test_a_voided_charge_row_names_its_counter_and_the_draws_given_back() -> None:
    charge = VoidedCharge(CounterKey("calls", "org", 100, 900), 4, (("g", 1),))
    assert charge.to_row([("g", 1), ("h", 2)]) == ["org", "calls", 4, 100, [["g", 1], ["h", 2]]]
    assert charge.to_row([]) == ["org", "calls", 4, 100, []]


def test_a_void_takes_a_windows_cost_back_down_to_zero_and_keeps_the_rest() -> None:
    window = Limit("calls", maximum=10, period="1h")
    charge = VoidedCharge(CounterKey("calls", "org", 100, 900), 4, ())
    counted = CounterState(used=9, denied_count=2, denied_cost=5, first_denied_at_us=150)
    assert take_back(window, charge, counted, 10**12, past_windows=True).state == replace(
        counted, used=5
    )
    assert take_back(
        window, charge, CounterState(used=4), 0, past_windows=True
    ).state == CounterState(used=0)
    assert take_back(
        window, charge, CounterState(used=3), 0, past_windows=True
    ).state == CounterState(used=0)
    assert take_back(
        None, charge, CounterState(used=9), 0, past_windows=True
    ).state == CounterState(used=5)
    bucket = Limit("calls", maximum=10, period="10s", algorithm="token_bucket")
    assert take_back(
        bucket, charge, CounterState(used=9), 0, past_windows=True
    ).state == CounterState(used=5)


def test_a_gauges_void_takes_its_level_but_never_more_than_the_cost() -> None:
    gauge = Limit("disk", maximum=100, period="1h", aggregation="max")
    charge = VoidedCharge(CounterKey("disk", "org", 100, 900), 3, ())
    summed = CounterState(used=15, denied_count=1)  # summed before it became a gauge
    level = CounterState(used=3, denied_count=1)
    outcome = take_back(gauge, charge, summed, 0, past_windows=True, level=level)
    assert (outcome.state, outcome.returned) == (replace(summed, used=12), 3)
    peak = CounterState(used=40)  # its own reports: the peak voided, the next one
    outcome = take_back(
        gauge, replace(charge, cost=40), peak, 0, past_windows=True, level=CounterState(used=20)
    )
    assert (outcome.state, outcome.returned) == (CounterState(used=20), 20)
    outcome = take_back(gauge, charge, peak, 0, past_windows=True, level=CounterState(used=40))
    assert (outcome.state, outcome.returned) == (peak, 0)


def test_a_void_gives_a_bucket_its_tokens_back_as_of_now() -> None:
    bucket = Limit("api", maximum=10, period="10s", algorithm="token_bucket")
    charge = VoidedCharge(CounterKey("api", "org", NO_WINDOW, NO_WINDOW), 4, ())
    # empty at 0 s (full again at 10 s); at 1 s one token has come back
    empty = CounterState(used=10, denied_count=1, tat_us=10 * SECOND, tat_rem=0, tat_scale=10)
    assert take_back(bucket, charge, empty, SECOND, past_windows=True).state == CounterState(
        used=6, denied_count=1, tat_us=6 * SECOND, tat_rem=0, tat_scale=10
    )
    # at 7 s only 3 were missing: the arrival time cannot go before now
    assert take_back(bucket, charge, empty, 7 * SECOND, past_windows=True).state == CounterState(
        used=6, denied_count=1, tat_us=7 * SECOND, tat_rem=0, tat_scale=10
    )
    assert (
        take_back(None, charge, empty, SECOND, past_windows=True).state == empty
    )  # the bucket was deleted
    window = Limit("api", maximum=10, period="10s")
    assert (
        take_back(window, charge, empty, SECOND, past_windows=True).state == empty
    )  # redefined as a window


def test_a_hold_keeps_the_charges_whose_counters_it_still_names() -> None:
    """A reset drops a hold's charges on the counters it clears: those are the rest."""
    a = VoidedCharge(CounterKey("a", "org", 10, 20), 3, ())
    b = VoidedCharge(CounterKey("b", "org", 10, 20), 2, ())
    b_later = VoidedCharge(CounterKey("b", "org", 20, 30), 2, ())
    held = [HeldCharge("org", "b", 2, 10, 20)]
    assert split_held([a, b, b_later], held) == ([b], [a, b_later])
    assert split_held([a], []) == ([], [a])


def test_the_counters_an_events_void_changes_take_a_gauges_level() -> None:
    gauge = Limit("disk", maximum=100, period="1h", aggregation="max")
    calls = Limit("calls", maximum=100, period="1h")
    disk_key, calls_key = CounterKey("disk", "org", 0, 900), CounterKey("calls", "org", 0, 900)
    charges = [VoidedCharge(disk_key, 40, ()), VoidedCharge(calls_key, 5, ())]
    states = {disk_key: CounterState(used=40), calls_key: CounterState(used=7)}
    limits = {"disk": gauge, "calls": calls}
    levels = {disk_key: CounterState(used=25)}  # the next report's level
    changed, returned = taken_back(limits, charges, states, 0, past_windows=True, levels=levels)
    assert changed == {disk_key: CounterState(used=25), calls_key: CounterState(used=2)}
    assert returned == [15, 5]
    # without a level, a gauge's counter goes down by the cost, as a sum's
    changed, returned = taken_back(limits, charges, states, 0, past_windows=True)
    assert changed == {disk_key: CounterState(used=0), calls_key: CounterState(used=2)}
    assert returned == [40, 5]
