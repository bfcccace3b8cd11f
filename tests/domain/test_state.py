"""A counter's state (`domain/state.py`): a denial counts once and keeps the
first instant denied; consuming changes only ``used``."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from metering.domain.state import NO_WINDOW, CounterKey, CounterState


def test_a_new_counter_is_empty() -> None:
    state = CounterState()
    assert (state.used, state.denied_count, state.denied_cost) == (0, 0, 0)
    assert state.first_denied_at_us is None and state.tat_us is None
    assert (state.tat_rem, state.tat_scale) == (0, 1)


def test_a_denial_counts_its_cost_and_keeps_the_first_instant() -> None:
    first = CounterState(used=7).with_denial(3, 100)
    assert first == CounterState(used=7, denied_count=1, denied_cost=3, first_denied_at_us=100)
    second = first.with_denial(2, 250)
    assert second == CounterState(used=7, denied_count=2, denied_cost=5, first_denied_at_us=100)


def test_a_denial_at_the_epoch_is_kept_as_the_first() -> None:
    state = CounterState().with_denial(1, 0).with_denial(1, 50)
    assert state.first_denied_at_us == 0


def test_a_denial_leaves_a_buckets_arrival_time() -> None:
    bucket = CounterState(used=4, tat_us=900, tat_rem=2, tat_scale=10)
    denied = bucket.with_denial(1, 5)
    assert (denied.tat_us, denied.tat_rem, denied.tat_scale) == (900, 2, 10)


def test_consuming_changes_only_used() -> None:
    state = CounterState(
        used=1,
        denied_count=2,
        denied_cost=3,
        first_denied_at_us=4,
        tat_us=5,
        tat_rem=6,
        tat_scale=7,
    )
    assert state.with_used(9) == CounterState(9, 2, 3, 4, 5, 6, 7)
    assert state.used == 1  # states are values: the old one is unchanged


def test_states_and_keys_are_values() -> None:
    assert CounterKey("calls", "org", 0, 10) == CounterKey("calls", "org", 0, 10)
    assert len({CounterKey("calls", "org", 0, 10), CounterKey("calls", "org", 0, 10)}) == 1
    with pytest.raises(FrozenInstanceError):
        CounterState().used = 1  # type: ignore[misc]
    assert NO_WINDOW == 0
