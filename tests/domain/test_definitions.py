"""`metering.domain.definitions`: the default maximum and enforcement in force at an instant."""

from __future__ import annotations

from metering.domain.definitions import Definition, changed, default_at, in_force

FIRST = Definition(1_000, 100, "soft")
RAISED = Definition(2_000, 200, "soft")
HARD = Definition(3_000, 200, "hard")
HISTORY = [FIRST, RAISED, HARD]


def test_the_latest_change_at_or_before_the_instant_is_in_force() -> None:
    assert in_force(HISTORY, 1_000) == FIRST
    assert in_force(HISTORY, 1_999) == FIRST
    assert in_force(HISTORY, 2_000) == RAISED
    assert in_force(HISTORY, 2_999) == RAISED
    assert in_force(HISTORY, 10**12) == HARD


def test_before_the_first_change_the_first_is_in_force() -> None:
    assert in_force(HISTORY, 0) == FIRST  # a late event's window, before the definition
    assert in_force([], 5) is None


def test_the_default_at_an_instant_falls_back_to_todays() -> None:
    assert default_at(HISTORY, 999, 2_500) == 200
    assert default_at([], 999, 2_500) == 999  # no history recorded
    assert default_at(HISTORY, None, 2_500) is None  # no maximum: a token bucket


def test_only_a_different_maximum_or_enforcement_is_a_change() -> None:
    assert changed([], 100, "soft")
    assert not changed(HISTORY, 200, "hard")
    assert changed(HISTORY, 300, "hard")
    assert changed(HISTORY, 200, "soft")
