"""`covered` takes a counter only when its room (its own, and its grants'
when they are steady over the batch) holds every charge of the batch, and
`allowed_row` and `drawn_row` write the row `decide` would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.domain.grants import Balance, Pot
from metering.domain.limits import Limit
from metering.domain.room import Sums, allowed_row, covered, drawn_row, qualifies
from metering.domain.rules import Rule, decide, fresh_state

CALLS = Rule.of(Limit("calls", maximum=10, period="1mo", window="calendar"))
LOUD = Rule.of(Limit("loud", maximum=10, period="1mo", window="calendar", thresholds=(80,)))
RULES = {"calls": CALLS, "loud": LOUD}
START, END = 1_000, 2_000
KEY = ("calls", "org", START)


def _note(sums: Sums, pair: tuple[str, str], at_us: int) -> None:
    """A charge of entitled ``pair`` at ``at_us``, as a batch's plan notes it."""
    sums.timed.add(pair)
    span = sums.span
    sums.span = (at_us, at_us) if span is None else (min(span[0], at_us), max(span[1], at_us))


def _sums(total: int, *more: tuple[tuple[str, str, int], int]) -> Sums:
    sums = Sums()
    sums.totals[KEY] = total
    for key, cost in more:
        sums.totals[key] = cost
    return sums


@pytest.mark.parametrize(("total", "taken"), [(6, True), (7, True), (8, False)])
def test_a_counter_is_covered_up_to_its_room(total: int, taken: bool) -> None:
    states = {KEY: [3, 0, 0, None, None, 0, 1]}  # 3 used of 10: room 7
    assert (KEY in covered(_sums(total), RULES, states, {}, {}, {})) is taken


def test_what_announces_is_never_covered() -> None:
    loud = ("loud", "org", START)
    assert covered(_sums(1, (loud, 1)), RULES, {}, {}, {}, {}) == {KEY: (10, None, 0)}


# 3 used of 10: own thresholds at 60 % (6) and at 8 units.
@pytest.mark.parametrize(
    ("total", "alerts", "taken"),
    [
        (2, ((60,), ()), True),  # up to 5: below 6
        (3, ((60,), ()), False),  # 6 reached
        (4, ((), (8,)), True),
        (5, ((), (8,)), False),
        (3, ((30,), (3,)), True),  # crossed before the batch
    ],
)
def test_own_thresholds_are_covered_when_the_batch_crosses_none(
    total: int, alerts: tuple[tuple[int, ...], tuple[int, ...]], taken: bool
) -> None:
    states = {KEY: [3, 0, 0, None, None, 0, 1]}
    own = {("calls", "org"): alerts}
    assert (KEY in covered(_sums(total), RULES, states, {}, {}, own)) is taken
    pots = {("calls", "org"): Pot([Balance("g", 5, 0, 0, None)])}  # with grants: never
    assert covered(_sums(1), RULES, states, {}, pots, own) == {}


def test_an_entitlement_that_changes_within_the_batch_is_not_covered() -> None:
    history = {("calls", "org"): ((1_500, 20),)}
    sums = _sums(1)
    _note(sums, ("calls", "org"), 1_200)
    assert covered(sums, RULES, {}, history, {}, {}) == {KEY: (10, None, 0)}
    _note(sums, ("calls", "org"), 1_600)  # the maximum changes at 1,500
    assert covered(sums, RULES, {}, history, {}, {}) == {}


@pytest.mark.parametrize(
    ("history", "maximum"),
    [
        (((500, 20),), 20),
        (((500, 20), (1_200, 30)), 30),  # in force from the batch's first instant
        (((500, 20), (900, None)), 10),  # back to the limit's
        (((1_300, 20),), 10),  # after the batch's times: the limit's
    ],
)
def test_an_entitlement_steady_over_the_batch_gives_the_maximum_in_force(
    history: tuple[tuple[int, int | None], ...], maximum: int
) -> None:
    sums = _sums(1)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "org"), 1_250)
    histories = {("calls", "org"): history}
    assert covered(sums, RULES, {}, histories, {}, {}) == {KEY: (maximum, None, 0)}


def test_a_pair_with_grants_is_covered_only_when_all_its_counters_are() -> None:
    pots = {("calls", "org"): Pot([Balance("g", 5, 0, 0, None)])}
    later = ("calls", "org", END)
    assert KEY in covered(_sums(1, (later, 10)), RULES, {}, {}, pots, {})
    assert covered(_sums(1, (later, 11)), RULES, {}, {}, pots, {}) == {}


# Own room 7 (3 used of 10, 1 of them paid by the grants), and the grants' 4 + 2.
GRANTED_STATES = {KEY: [4, 0, 0, None, None, 0, 1]}


def _pots() -> dict[tuple[str, str], Pot]:
    balances = [Balance("g", 5, 1, 0, None), Balance("h", 2, 0, 0, 5_000, priority=1)]
    return {("calls", "org"): Pot(balances, {START: 1})}


@pytest.mark.parametrize(("total", "taken"), [(12, True), (13, True), (14, False)])
def test_grants_count_in_the_room_up_to_what_they_hold(total: int, taken: bool) -> None:
    sums = _sums(total)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "org"), 1_600)
    assert (KEY in covered(sums, RULES, GRANTED_STATES, {}, _pots(), {})) is taken


@pytest.mark.parametrize(
    ("last_us", "taken"), [(4_999, True), (5_000, False)]
)  # "h" expires at 5,000
def test_grants_that_change_within_the_batch_do_not_count(last_us: int, taken: bool) -> None:
    sums = _sums(13)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "org"), last_us)
    assert (KEY in covered(sums, RULES, GRANTED_STATES, {}, _pots(), {})) is taken
    untimed = _sums(13)  # no times: the grants are not counted
    assert covered(untimed, RULES, GRANTED_STATES, {}, _pots(), {}) == {}


def test_grants_count_only_when_steady_over_the_whole_batchs_times() -> None:
    sums = _sums(13)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "other"), 5_000)  # "h" expires then: in the batch's span
    assert sums.span == (1_200, 5_000)
    assert covered(sums, RULES, GRANTED_STATES, {}, _pots(), {}) == {}


def test_grants_of_a_pair_charged_in_two_windows_do_not_count() -> None:
    sums = _sums(8, (("calls", "org", END), 1))
    _note(sums, ("calls", "org"), 1_200)
    assert covered(sums, RULES, GRANTED_STATES, {}, _pots(), {}) == {}


@pytest.mark.parametrize("granted", [False, True])
def test_the_row_is_the_one_decide_writes(granted: bool) -> None:
    pot = Pot([Balance("g", 5, 1, 0, None)], {START: 1}) if granted else None
    used = [4, 0, 0, None, None, 0, 1]
    room = covered(_sums(3), RULES, {KEY: used}, {}, {("calls", "org"): pot} if pot else {}, {})
    state, expected_state = list(used), list(used)
    if pot is None:
        row = allowed_row("org", "calls", 3, state, room[KEY], (START, END))
    else:
        row = drawn_row("org", "calls", 3, state, room[KEY], (START, END), 1_500)
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


def test_a_drawn_row_is_the_one_decide_writes() -> None:
    """Charges past the own room, each drawing on the grants by their order."""
    sums = _sums(13)
    _note(sums, ("calls", "org"), 1_500)
    drawn, decided = _pots(), _pots()
    room = covered(sums, RULES, GRANTED_STATES, {}, drawn, {})[KEY]
    state, expected_state = list(GRANTED_STATES[KEY]), list(GRANTED_STATES[KEY])
    pot = decided[("calls", "org")]
    for cost in (5, 3, 4, 1):  # the last two draw on "h" (priority 1) after "g"
        row = drawn_row("org", "calls", cost, state, room, (START, END), 1_500)
        charge = [("org", "calls", cost)]
        verdict = decide([CALLS], charge, [(START, END)], [expected_state], 1_500, "e", None, [pot])
        assert (row, state) == (verdict.rows[0], expected_state)
    assert drawn == decided


def test_grants_that_pay_none_of_the_batch_leave_each_row_the_one_decide_writes() -> None:
    """Own room 7 fits the batch's 7: the steady grants' 4 + 2 (and the 1
    they paid) are in every row's remaining, as `decide` finds them."""
    sums = _sums(7)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "org"), 1_600)
    pots, decided = _pots(), _pots()
    room = covered(sums, RULES, GRANTED_STATES, {}, pots, {})[KEY]
    assert room == (10, None, 1 + 4 + 2)
    state, expected_state = list(GRANTED_STATES[KEY]), list(GRANTED_STATES[KEY])
    pot = decided[("calls", "org")]
    for cost, at_us in ((3, 1_200), (0, 1_300), (4, 1_600)):
        row = allowed_row("org", "calls", cost, state, room, (START, END))
        charge = [("org", "calls", cost)]
        verdict = decide([CALLS], charge, [(START, END)], [expected_state], at_us, "e", None, [pot])
        assert (row, state) == (verdict.rows[0], expected_state)
    assert pots == decided


def test_grants_that_change_within_the_batch_stay_in_the_room_that_pays_none() -> None:
    sums = _sums(7)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "org"), 5_000)  # "h" expires then
    pots = _pots()
    assert covered(sums, RULES, GRANTED_STATES, {}, pots, {}) == {
        KEY: (10, pots[("calls", "org")], 1)
    }


@st.composite
def _one_grant(draw: st.DrawFn) -> tuple[int, int, int, int, int, int, int | None, int, list[int]]:
    """A counter and a pot of one grant, and charges that fit them: built to
    fit (filtering random ones rejects most, and a mutation run pays for it)."""
    maximum = draw(st.integers(1, 6))
    own = draw(st.integers(0, maximum))
    granted = draw(st.integers(0, 4))
    amount = draw(st.integers(1, 12))
    used = draw(st.integers(0, amount))
    effective = draw(st.integers(1_000, 1_600))
    expires = draw(st.none() | st.integers(1_000, 2_000))
    at_us = draw(st.integers(1_000, 1_999))
    left = amount - used if effective <= at_us and (expires is None or at_us < expires) else 0
    room, costs = maximum - own + left, []
    for _ in range(draw(st.integers(1, 6))):
        cost = draw(st.integers(0, min(5, room)))
        costs.append(cost)
        room -= cost
    return maximum, own, granted, amount, used, effective, expires, at_us, costs


@settings(max_examples=300, deadline=None)
@given(case=_one_grant())
def test_a_pot_of_one_grant_draws_as_decide_does(
    case: tuple[int, int, int, int, int, int, int | None, int, list[int]],
) -> None:
    """`drawn_row` on a pot of one grant (drawn without `Pot.draw`'s loop):
    each row, counter and grant as `decide` (`fit_window`) leaves them, for
    charges that fit, the grant active at the charge or not."""
    maximum, own, granted, amount, used, effective, expires, at_us, costs = case
    rule = Rule.of(Limit("calls", maximum=maximum, period="1mo", window="calendar"))

    def pot() -> Pot:  # a window the grants paid nothing of yet has no entry
        granted_by = {START: granted} if granted else {}
        return Pot([Balance("g", amount, used, effective, expires)], granted_by)

    drawn, decided = pot(), pot()
    room = (maximum, drawn, granted)
    state = [own + granted, 0, 0, None, None, 0, 1]
    expected_state = list(state)
    for cost in costs:
        row = drawn_row("org", "calls", cost, state, room, (START, END), at_us)
        charge, window = [("org", "calls", cost)], [(START, END)]
        verdict = decide([rule], charge, window, [expected_state], at_us, "e", None, [decided])
        assert (row, state) == (verdict.rows[0], expected_state)
    assert drawn == decided


def _key(subject: str, start: int = START) -> tuple[str, str, int]:
    return ("calls", subject, start)


def test_each_counter_of_a_batch_is_judged_on_its_own_in_any_order() -> None:
    """A counter that cannot be covered drops its pair's other counters, and
    only them: those after it are still judged (and those before)."""
    sums = Sums()
    plan = [
        (("loud", "a", START), 1),  # announces
        (_key("untimed"), 1),  # an entitlement, its times unknown
        (_key("changing"), 1),  # an entitlement changing within the batch
        (_key("alert"), 2),  # crosses its own 50 % (5 units)
        (_key("alert", END), 1),  # crosses none: its pair is dropped anyway
        (_key("over"), 8),  # 3 used: past the maximum, no grants
        (_key("good"), 7),
        (_key("steady"), 1),  # grants that pay none of the batch
        (_key("paid"), 9),  # grants pay 2 of it
        (_key("twice"), 9),  # grants would pay, but the pair has two windows
        (_key("twice", END), 1),
        (_key("ungranted"), 9),  # grants would pay, but its times are unknown
        (_key("past"), 1),  # own usage past a lowered maximum: grants pay nothing
        (_key("short"), 13),  # own room 7 and grants 5: one short
        (_key("full"), 2),  # own usage at the maximum: grants pay it all
        (_key("last"), 1),
    ]
    for key, total in plan:
        sums.totals[key] = total
    for subject in ("changing", "over", "steady", "paid", "twice", "past", "short", "full"):
        _note(sums, ("calls", subject), 1_200)
    _note(sums, ("calls", "changing"), 1_600)
    states = {key: [3, 0, 0, None, None, 0, 1] for key, _ in plan}
    states[_key("past")] = [12, 0, 0, None, None, 0, 1]
    states[_key("full")] = [10, 0, 0, None, None, 0, 1]
    histories = {
        ("calls", "untimed"): ((500, 20),),
        ("calls", "changing"): ((500, 20), (1_500, 30)),
    }
    pots = {
        ("calls", subject): Pot([Balance("g", 5, 0, 0, None)])
        for subject in ("steady", "paid", "twice", "ungranted", "past", "short", "full")
    }
    alerts = {("calls", "alert"): ((50,), ())}
    found = covered(sums, RULES, states, histories, pots, alerts)
    assert found == {
        _key("good"): (10, None, 0),
        _key("steady"): (10, None, 5),
        _key("paid"): (10, pots[("calls", "paid")], 0),
        _key("full"): (10, pots[("calls", "full")], 0),
        _key("last"): (10, None, 0),
    }


@pytest.mark.parametrize(
    ("used", "total", "taken"),
    [(100, 1, False), (99, 1, True)],  # 100 % of 101 is 101 units
)
def test_own_percentages_are_crossed_exactly_as_notices_find_them(
    used: int, total: int, taken: bool
) -> None:
    rules = {"calls": Rule.of(Limit("calls", maximum=101, period="1mo", window="calendar"))}
    states = {KEY: [used, 0, 0, None, None, 0, 1]}
    own = {("calls", "org"): ((100,), ())}
    assert (KEY in covered(_sums(total), rules, states, {}, {}, own)) is taken


@pytest.mark.parametrize(
    ("balances", "held"),
    [
        ([Balance("from_first", 5, 1, 1_200, None)], 4),  # active from the batch's first time
        ([Balance("one", 1, 0, 0, None), Balance("used_up", 3, 3, 0, None)], 1),
        ([Balance("later", 5, 0, 1_601, None)], 0),  # active after the batch only
        ([Balance("gone", 5, 0, 0, 1_200)], 0),  # expired at its first time
        ([Balance("g", 5, 0, 0, 1_601), Balance("at_last", 5, 0, 1_600, None)], None),
        ([Balance("mid", 5, 0, 1_400, None)], None),  # active from within the batch
        ([Balance("ends", 5, 0, 0, 1_600)], None),  # expires at its last time
    ],
)
def test_grants_steady_over_the_batch_add_what_they_hold(
    balances: list[Balance], held: int | None
) -> None:
    sums = _sums(1)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "org"), 1_600)
    pot = Pot(balances, {START: 2})
    states = {KEY: [4, 0, 0, None, None, 0, 1]}
    room = covered(sums, RULES, states, {}, {("calls", "org"): pot}, {})[KEY]
    assert room == ((10, pot, 2) if held is None else (10, None, 2 + held))


def test_an_entitlement_in_force_before_the_batch_and_changing_after_it() -> None:
    sums = _sums(1)
    _note(sums, ("calls", "org"), 1_200)
    _note(sums, ("calls", "org"), 1_250)
    history = {("calls", "org"): ((500, 20), (1_300, 30))}
    assert covered(sums, RULES, {}, history, {}, {}) == {KEY: (20, None, 0)}


def test_what_announces_or_is_not_a_plain_sum_does_not_qualify() -> None:
    assert qualifies(CALLS) and not qualifies(LOUD)
    gauge = Rule.of(Limit("disk", maximum=5, period="1h", aggregation="max"))
    paced = Rule.of(Limit("p", maximum=5, period="1h", pacing=True))
    floating = Rule.of(Limit("seats", maximum=5, algorithm="concurrent"))
    bucket = Rule.of(Limit("api", maximum=5, period="1m", algorithm="token_bucket"))
    assert [qualifies(rule) for rule in (gauge, paced, floating, bucket)] == [False] * 4
