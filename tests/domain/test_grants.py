"""The pure rules of entitlements, grants and corrections (metering.domain)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.domain.corrections import (
    MAX_REASON_CHARS,
    VoidedCharge,
    take_back,
    validate_reason,
    voided_charges,
)
from metering.domain.decisions import ChargeDecision
from metering.domain.grants import (
    MAX_GRANT,
    MAX_PRIORITY,
    Balance,
    Pot,
    drawn_since,
    fit_window,
    maximum_at,
    used_by_grant,
    validate_amount,
    validate_grant_id,
    validate_priority,
)
from metering.domain.limits import Limit
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.errors import InvalidInput

SECOND = 1_000_000


def test_the_maximum_at_an_instant_is_the_latest_change_at_or_before_it() -> None:
    history = ((100, 7), (200, None), (300, 9))
    assert [maximum_at(history, 5, at) for at in (99, 100, 199, 200, 299, 300, 10**9)] == [
        5,
        7,
        7,
        5,
        5,
        9,
        9,
    ]
    assert maximum_at((), 5, 100) == maximum_at(None, 5, 100) == 5


def test_a_grant_is_active_from_its_start_until_just_before_its_expiry() -> None:
    grant = Balance("g", amount=10, used=4, effective_from_us=100, expires_at_us=200)
    assert [grant.active_at(at) for at in (99, 100, 199, 200)] == [False, True, True, False]
    assert grant.left == 6
    assert Balance("g", 1, 0, 100, None).active_at(10**15)


def test_grants_are_drawn_earliest_expiring_first_then_earliest_given_then_by_id() -> None:
    pot = Pot(
        [
            Balance("never", 5, 0, 0, None),
            Balance("b-late", 5, 0, 50, 1000),
            Balance("a-late", 5, 0, 50, 1000),
            Balance("soon", 5, 2, 0, 500),
            Balance("given-first", 5, 0, 10, 1000),
            Balance("spent", 5, 5, 0, 100),
        ]
    )
    assert [b.grant_id for b in pot.balances] == [
        "spent",
        "soon",
        "given-first",
        "a-late",
        "b-late",
        "never",
    ]
    assert pot.available(60) == 3 + 5 + 5 + 5 + 5
    assert pot.plan(9, 60) == [("soon", 3), ("given-first", 5), ("a-late", 1)]
    assert pot.plan(0, 60) == []
    assert pot.plan(9, 20) == [("soon", 3), ("given-first", 5), ("never", 1)]  # a-late not yet
    pot.take(7, [("soon", 3), ("never", 1)])
    pot.take(7, [("never", 2)])
    assert (pot.balances[1].used, pot.balances[5].used, pot.granted) == (5, 3, {7: 6})


def test_a_window_uses_its_own_allowance_before_any_grant() -> None:
    pot = Pot([Balance("g", 10, 0, 0, None)])
    inside = fit_window(10, used=4, granted=0, cost=6, pot=pot, at_us=0, soft=False)
    assert (inside.fits, inside.draws, inside.remaining_before, inside.remaining_after) == (
        True,
        (),
        16,
        10,
    )
    across = fit_window(10, used=8, granted=0, cost=5, pot=pot, at_us=0, soft=False)
    assert (across.fits, across.draws, across.remaining_after) == (True, (("g", 3),), 7)
    beyond = fit_window(10, used=10, granted=0, cost=11, pot=pot, at_us=0, soft=False)
    assert (beyond.fits, beyond.draws, beyond.remaining_before) == (False, (), 10)
    assert beyond.overage_before == 0  # overage_after counts only if consumed


def test_own_usage_is_used_less_granted() -> None:
    pot = Pot([Balance("g", 10, 6, 0, None)])
    # used 12 of which 6 was granted: own usage 6 of 10, so 4 own and 4 granted left.
    fit = fit_window(10, used=12, granted=6, cost=8, pot=pot, at_us=0, soft=False)
    assert (fit.fits, fit.draws, fit.remaining_before, fit.remaining_after) == (
        True,
        (("g", 4),),
        8,
        0,
    )
    # after a downgrade below own usage, a hard window has no room: grants pay nothing
    down = fit_window(3, used=12, granted=6, cost=2, pot=pot, at_us=0, soft=False)
    assert (down.fits, down.draws, down.overage_before) == (False, (), 3)
    assert (down.remaining_before, down.remaining_after) == (0, 0)


def test_a_grant_adds_room_only_over_the_maximum_in_force() -> None:
    """Maximum 3, 3 used, lowered to 1, a grant of 1: used 3 is past 1 + 1 drawn
    already, so a hard window denies whatever the grant holds; a soft one still
    draws it (the grant pays, the overage stays)."""
    pot = Pot([Balance("g", 1, 0, 0, None)])
    hard = fit_window(1, used=3, granted=0, cost=1, pot=pot, at_us=0, soft=False)
    assert (hard.fits, hard.draws, hard.remaining_before, hard.overage_before) == (
        False,
        (),
        0,
        2,
    )
    soft = fit_window(1, used=3, granted=0, cost=1, pot=pot, at_us=0, soft=True)
    assert (soft.fits, soft.draws, soft.remaining_before, soft.overage_after) == (
        True,
        (("g", 1),),
        1,
        2,
    )
    # exactly at the maximum in force, the grant is room again
    full = fit_window(1, used=1, granted=0, cost=1, pot=pot, at_us=0, soft=False)
    assert (full.fits, full.draws, full.overage_after) == (True, (("g", 1),), 0)


def test_a_soft_limit_draws_what_it_can_and_the_rest_is_overage() -> None:
    pot = Pot([Balance("g", 3, 0, 0, None)])
    fit = fit_window(10, used=9, granted=0, cost=6, pot=pot, at_us=0, soft=True)
    assert (fit.fits, fit.draws, fit.overage_after, fit.remaining_after) == (
        False,
        (("g", 3),),
        2,
        0,
    )
    hard = fit_window(10, used=9, granted=0, cost=6, pot=pot, at_us=0, soft=False)
    assert hard.draws == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "between 1 and"),
        (MAX_GRANT + 1, "between 1 and"),
        (True, "whole number"),
        (1.5, "whole number"),
    ],
)
def test_an_amount_is_a_whole_number_in_range(value: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as raised:
        validate_amount("amount", value)
    assert raised.value.field == "amount"
    assert validate_amount("amount", MAX_GRANT) == MAX_GRANT


@pytest.mark.parametrize("value", ["", "a b", "x" * 129, 7, None, "é"])
def test_a_grant_id_is_like_an_event_id(value: object) -> None:
    with pytest.raises(InvalidInput, match="grant_id"):
        validate_grant_id(value)
    assert validate_grant_id("goodwill-1:org/42") == "goodwill-1:org/42"


@pytest.mark.parametrize("value", ["", "   ", None, 3, "x" * (MAX_REASON_CHARS + 1), "a\nb"])
def test_a_reason_is_short_printable_text(value: object) -> None:
    with pytest.raises(InvalidInput, match="reason"):
        validate_reason(value)
    assert validate_reason("x" * MAX_REASON_CHARS) == "x" * MAX_REASON_CHARS


def _row(outcome: str, allowed: bool = True, **more: object) -> list[object]:
    charge = ChargeDecision(
        subject="org",
        limit="calls",
        cost=4,
        allowed=allowed,
        outcome=outcome,  # type: ignore[arg-type]
        used=8,
        remaining=2,
        maximum=10,
        overage=0,
        window_start_us=more.get("start", 100),  # type: ignore[arg-type]
        resets_at_us=900,
        retry_at_us=None,
        grants=more.get("grants", ()),  # type: ignore[arg-type]
    )
    return charge.to_row()


def test_only_the_consumed_charges_of_an_allowed_event_are_voided() -> None:
    rows = [
        _row("allowed", grants=(("g", 1),)),
        _row("would_deny"),
        _row("overage", start=None),
    ]
    found = voided_charges("allowed", rows)
    assert found == [
        VoidedCharge(CounterKey("calls", "org", 100, 900), 4, (("g", 1),)),
        VoidedCharge(CounterKey("calls", "org", NO_WINDOW, NO_WINDOW), 4, ()),
    ]
    assert voided_charges("denied", rows) == voided_charges("rejected", rows) == []


def test_a_void_takes_a_windows_cost_back_but_never_below_zero() -> None:
    charge = VoidedCharge(CounterKey("calls", "org", 100, 900), 4, ())
    limit = Limit("calls", maximum=10, period="1h")
    assert take_back(limit, charge, CounterState(used=9), 0, past_windows=True).state.used == 5
    assert take_back(
        limit, charge, CounterState(used=3, denied_count=2), 0, past_windows=True
    ).state == CounterState(used=0, denied_count=2)
    assert (
        take_back(None, charge, CounterState(used=9), 0, past_windows=True).state.used == 5
    )  # limit deleted since


def test_a_void_gives_a_bucket_its_tokens_back_up_to_its_capacity() -> None:
    bucket = Limit("api", maximum=10, period="10s", algorithm="token_bucket")
    charge = VoidedCharge(CounterKey("api", "org", NO_WINDOW, NO_WINDOW), 4, ())
    # empty at 0 s (arrival time 10 s): 4 back moves it to 6 s
    empty = CounterState(used=10, tat_us=10 * SECOND, tat_rem=0, tat_scale=10)
    after = take_back(bucket, charge, empty, 0, past_windows=True).state
    assert (after.used, after.tat_us) == (6, 6 * SECOND)
    full = CounterState(used=10, tat_us=0, tat_rem=0, tat_scale=10)
    assert take_back(bucket, charge, full, SECOND, past_windows=True).state == full
    window = Limit("api", maximum=10, period="10s")
    assert (
        take_back(window, charge, empty, 0, past_windows=True).state == empty
    )  # redefined as a window since


def test_validate_priority_takes_0_to_max_and_names_priority() -> None:
    assert validate_priority(0) == 0
    assert validate_priority(MAX_PRIORITY) == MAX_PRIORITY == 1000
    for wrong, message in (
        (-1, "priority: must be between 0 and 1000, got -1"),
        (1001, "priority: must be between 0 and 1000, got 1001"),
        (True, "priority: must be a whole number, got True"),
    ):
        with pytest.raises(InvalidInput) as refused:
            validate_priority(wrong)
        assert str(refused.value) == message


_balances = st.lists(
    st.builds(
        Balance,
        grant_id=st.sampled_from(["g1", "g2", "g3", "g4"]),
        amount=st.integers(0, 50),
        used=st.integers(0, 50),
        effective_from_us=st.integers(0, 10),
        expires_at_us=st.none() | st.integers(0, 20),
        priority=st.integers(0, 3),
    ),
    max_size=4,
    unique_by=lambda b: b.grant_id,
)


@given(_balances, st.integers(-5, 120), st.integers(0, 20), st.integers(0, 1))
def test_drawing_in_one_pass_is_available_then_plan_then_take(
    balances: list[Balance], amount: int, at_us: int, start: int
) -> None:
    def pot() -> Pot:
        copies = [Balance(**{f: getattr(b, f) for f in Balance.__slots__}) for b in balances]
        return Pot(copies, {0: 7})

    slow, fast = pot(), pot()
    available = slow.available(at_us)
    draws = slow.plan(amount, at_us) if amount > 0 else []
    slow.take(start, draws)
    assert fast.draw(start, amount, at_us) == (available, [list(d) for d in draws])
    assert [b.used for b in fast.balances] == [b.used for b in slow.balances]
    assert fast.granted == slow.granted


_charges = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # the subject
        st.integers(0, 1),  # the window's start
        st.integers(-5, 60),  # what its grants are asked for
        st.integers(0, 20),  # its time
        st.booleans(),  # drawn (`Pot.draw`) or planned then taken
    ),
    max_size=12,
)


@given(_balances, _balances, _charges, st.booleans(), st.booleans())
def test_a_batchs_draws_are_what_its_pots_drew_since_they_were_read(
    a: list[Balance],
    b: list[Balance],
    charges: list[tuple[str, int, int, int, bool]],
    read_window: bool,
    issued: bool,
) -> None:
    def copied(balances: list[Balance], prefix: str) -> list[Balance]:
        fields = Balance.__slots__
        return [
            Balance(**{f: getattr(x, f) for f in fields} | {"grant_id": prefix + x.grant_id})
            for x in balances
        ]

    granted = {1: 3} if read_window else {}  # a window's draws read with its counter
    pots = {
        ("calls", "a"): Pot(copied(a, "a-"), dict(granted)),
        ("calls", "b"): Pot(copied(b, "b-")),
    }
    used = used_by_grant(pots.values())
    if issued:  # a recurring grant issued by the batch: read with nothing used
        pots[("calls", "a")].balances.append(Balance("a-new", 9, 0, 0, None))
    summed: dict[tuple[str, str, int, str], int] = {}  # what the charges' rows list
    windows: set[tuple[str, int]] = set()  # the windows that drew
    for subject, start, amount, at_us, one_pass in charges:
        pot = pots[("calls", subject)]
        if one_pass:
            draws = pot.draw(start, amount, at_us)[1]
        else:
            draws = pot.plan(amount, at_us) if amount > 0 else []
            pot.take(start, draws)
        for grant_id, paid in draws:
            key = ("calls", subject, start, grant_id)
            summed[key] = summed.get(key, 0) + paid
            windows.add((subject, start))
    found = drawn_since(pots, used)
    one_each = len(windows) == len({subject for subject, _ in windows}) and not (
        read_window and ("a", 0) in windows
    )
    # A pot that drew knows the windows it drew in, and those read with draws:
    # with one, what it drew is that window's; with more, the rows tell (None).
    assert found == (summed if one_each else None)


def test_a_draw_at_a_grants_expiry_takes_nothing_from_it() -> None:
    pot = Pot([Balance("g", 10, 0, 0, 200)])
    assert pot.draw(0, 3, at_us=200) == (0, [])  # expired at 200: nothing left to draw
    assert pot.draw(0, 3, at_us=199) == (10, [["g", 3]])
    assert pot.granted == {0: 3}
