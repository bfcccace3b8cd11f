"""`covered` takes a counter only when its own room holds every charge of the
batch, and `allowed_row` writes the row `decide` would."""

from __future__ import annotations

import pytest

from metering.domain.grants import Balance, Pot
from metering.domain.limits import Limit
from metering.domain.room import Sums, allowed_row, covered
from metering.domain.rules import Rule, decide, fresh_state

CALLS = Rule.of(Limit("calls", maximum=10, period="1mo", window="calendar"))
LOUD = Rule.of(Limit("loud", maximum=10, period="1mo", window="calendar", thresholds=(80,)))
RULES = {"calls": CALLS, "loud": LOUD}
START, END = 1_000, 2_000
KEY = ("calls", "org", START)


def _sums(total: int, *more: tuple[tuple[str, str, int], int]) -> Sums:
    sums = Sums()
    sums.totals[KEY] = total
    for key, cost in more:
        sums.totals[key] = cost
    return sums


@pytest.mark.parametrize(("total", "taken"), [(6, True), (7, True), (8, False)])
def test_a_counter_is_covered_up_to_its_room(total: int, taken: bool) -> None:
    states = {KEY: [3, 0, 0, None, None, 0, 1]}  # 3 used of 10: room 7
    assert (KEY in covered(_sums(total), RULES, states, {}, {}, ())) is taken


def test_what_announces_or_is_excluded_is_never_covered() -> None:
    loud = ("loud", "org", START)
    assert covered(_sums(1, (loud, 1)), RULES, {}, {}, {}, ()) == {KEY: (10, None, 0)}
    assert covered(_sums(1), RULES, {}, {}, {}, [("calls", "org")]) == {}


def test_an_entitlement_that_changes_within_the_batch_is_not_covered() -> None:
    history = {("calls", "org"): ((1_500, 20),)}
    sums = _sums(1)
    sums.timed(("calls", "org"), 1_200)
    assert covered(sums, RULES, {}, history, {}, ()) == {KEY: (10, None, 0)}
    sums.timed(("calls", "org"), 1_600)  # the maximum changes at 1,500
    assert covered(sums, RULES, {}, history, {}, ()) == {}


def test_a_pair_with_grants_is_covered_only_when_all_its_counters_are() -> None:
    pots = {("calls", "org"): Pot([Balance("g", 5, 0, 0, None)])}
    later = ("calls", "org", END)
    assert KEY in covered(_sums(1, (later, 10)), RULES, {}, {}, pots, ())
    assert covered(_sums(1, (later, 11)), RULES, {}, {}, pots, ()) == {}


@pytest.mark.parametrize("granted", [False, True])
def test_the_row_is_the_one_decide_writes(granted: bool) -> None:
    pot = Pot([Balance("g", 5, 1, 0, None)], {START: 1}) if granted else None
    used = [4, 0, 0, None, None, 0, 1]
    room = covered(_sums(3), RULES, {KEY: used}, {}, {("calls", "org"): pot} if pot else {}, ())
    state, expected_state = list(used), list(used)
    available = pot.available(1_500) if pot else 0
    row = allowed_row("org", "calls", 3, state, room[KEY], (START, END), available)
    verdict = decide(
        [CALLS],
        [("org", "calls", 3)],
        [(START, END)],
        [expected_state],
        1_500,
        "e",
        None,
        [pot] if pot else None,
    )
    assert (row, state) == (verdict.rows[0], expected_state)
    assert fresh_state()[0] == 0
