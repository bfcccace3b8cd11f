"""Entitlements and grants to the unit: the maximum at an instant, a pot's
order and what it offers, a plan's draws, the arithmetic of a window topped
up by grants, and the validators' messages (pinned where mutation testing
found them unasserted; the rules are in ``test_grants.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.domain.grants import (
    Balance,
    Entitlement,
    Pot,
    WindowFit,
    fit_window,
    maximum_at,
    validate_amount,
    validate_grant_id,
)
from metering.domain.instants import to_us
from metering.errors import InvalidInput

NOW_US = to_us(datetime(2026, 11, 23, 12, 0, tzinfo=UTC))


def test_the_maximum_at_an_instant_follows_the_subjects_changes() -> None:
    history = ((100, 7), (200, None), (300, 9))
    at = (0, 99, 100, 150, 199, 200, 250, 299, 300, 301)
    assert [maximum_at(history, 5, us) for us in at] == [5, 5, 7, 7, 7, 5, 5, 5, 9, 9]
    assert maximum_at(((0, 3),), 5, 0) == 3  # a change at the epoch applies at once
    assert maximum_at((), 5, 10) == 5
    assert maximum_at(None, 5, 10) == 5


def test_a_balance_is_active_from_its_start_to_just_before_its_expiry() -> None:
    timed = Balance("g", amount=10, used=4, effective_from_us=100, expires_at_us=200)
    assert [timed.active_at(us) for us in (99, 100, 101, 199, 200, 201)] == [
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    lasting = Balance("g", amount=1, used=0, effective_from_us=100, expires_at_us=None)
    assert [lasting.active_at(us) for us in (99, 100, 2**62)] == [False, True, True]
    assert timed.left == 6
    # Priority first (the default for both), then expiry (issue 22).
    assert timed.order() == (100, 200, 100, "g")
    assert lasting.order() == (100, 2**62, 100, "g")


def test_a_pot_sorts_its_grants_earliest_expiring_then_earliest_given_then_by_id() -> None:
    pot = Pot(
        [
            Balance("lasting", 5, 0, 0, None),
            Balance("late-b", 5, 0, 50, 2**61),
            Balance("late-a", 5, 0, 50, 2**61),
            Balance("given-first", 5, 0, 10, 2**61),
            Balance("soon", 5, 0, 60, 500),
        ]
    )
    assert [b.grant_id for b in pot.balances] == [
        "soon",
        "given-first",
        "late-a",
        "late-b",
        "lasting",
    ]


def test_a_pot_offers_what_its_active_grants_have_left() -> None:
    pot = Pot(
        [
            Balance("one-left", 4, 3, 0, 1000),
            Balance("spent", 4, 4, 0, 1000),
            Balance("overdrawn", 4, 6, 0, 1000),  # never drawn on: it counts as empty
            Balance("later", 7, 0, 500, None),
            Balance("expired", 9, 0, 0, 300),
        ]
    )
    assert [pot.available(us) for us in (0, 299, 300, 499, 500, 999, 1000)] == [
        10,
        10,
        1,
        1,
        8,
        8,
        7,
    ]


def test_a_plan_draws_each_grant_as_far_as_it_goes_and_stops_when_paid() -> None:
    pot = Pot(
        [
            Balance("a", 3, 0, 0, 100),
            Balance("spent", 3, 3, 0, 150),
            Balance("b", 2, 1, 0, 200),
            Balance("not-yet", 9, 0, 50, 300),
            Balance("c", 5, 0, 0, 400),
        ]
    )
    assert pot.plan(3, 10) == [("a", 3)]  # paid in full: the others are not touched
    assert pot.plan(4, 10) == [("a", 3), ("b", 1)]
    assert pot.plan(6, 10) == [("a", 3), ("b", 1), ("c", 2)]
    assert pot.plan(6, 60) == [("a", 3), ("b", 1), ("not-yet", 2)]
    assert pot.plan(20, 10) == [("a", 3), ("b", 1), ("c", 5)]  # as much as there is
    assert pot.plan(0, 10) == []
    assert pot.plan(1, 100) == [("b", 1)]  # a expired at 100


def test_taking_draws_uses_the_grants_and_counts_them_per_window() -> None:
    pot = Pot([Balance("a", 5, 1, 0, None), Balance("b", 5, 0, 0, None)])
    pot.take(1000, [("a", 2), ("b", 3)])
    pot.take(2000, [("b", 1)])
    pot.take(1000, [("a", 1)])
    assert [(b.grant_id, b.used) for b in pot.balances] == [("a", 4), ("b", 4)]
    assert pot.granted == {1000: 6, 2000: 1}


def test_a_window_fit_pays_with_the_own_allowance_first_then_the_grants() -> None:
    def pot() -> Pot:
        return Pot([Balance("g1", 4, 1, 0, 500), Balance("g2", 2, 0, 0, None)])

    # maximum 10, used 7 of which 2 granted: own usage 5, own room 5; grants 3 + 2
    assert fit_window(10, 7, 2, 4, pot(), 100, soft=False) == WindowFit(
        fits=True,
        draws=(),
        remaining_before=10,
        remaining_after=6,
        overage_after=0,
        overage_before=0,
    )
    assert fit_window(10, 7, 2, 6, pot(), 100, soft=False) == WindowFit(
        fits=True,
        draws=(("g1", 1),),
        remaining_before=10,
        remaining_after=4,
        overage_after=0,
        overage_before=0,
    )
    assert fit_window(10, 7, 2, 10, pot(), 100, soft=False) == WindowFit(
        fits=True,
        draws=(("g1", 3), ("g2", 2)),
        remaining_before=10,
        remaining_after=0,
        overage_after=0,
        overage_before=0,
    )
    # one more than all of it: a hard limit takes nothing
    assert fit_window(10, 7, 2, 11, pot(), 100, soft=False) == WindowFit(
        fits=False,
        draws=(),
        remaining_before=10,
        remaining_after=0,
        overage_after=6,
        overage_before=0,
    )
    # a soft one draws every grant and the rest is overage
    assert fit_window(10, 7, 2, 11, pot(), 100, soft=True) == WindowFit(
        fits=False,
        draws=(("g1", 3), ("g2", 2)),
        remaining_before=10,
        remaining_after=0,
        overage_after=1,
        overage_before=0,
    )
    # at 500 g1 has expired: only g2 tops the window up
    assert fit_window(10, 7, 2, 6, pot(), 500, soft=False) == WindowFit(
        fits=True,
        draws=(("g2", 1),),
        remaining_before=7,
        remaining_after=1,
        overage_after=0,
        overage_before=0,
    )


def test_a_window_fit_past_its_own_maximum_has_only_the_grants_when_soft() -> None:
    pot = Pot([Balance("g", 3, 0, 0, None)])
    # maximum 4, used 7 of which 1 granted: 2 past the own maximum
    assert fit_window(4, 7, 1, 2, pot, 0, soft=False) == WindowFit(
        fits=False,
        draws=(),
        remaining_before=0,
        remaining_after=0,
        overage_after=4,
        overage_before=2,
    )
    assert fit_window(4, 7, 1, 2, pot, 0, soft=True) == WindowFit(
        fits=True,
        draws=(("g", 2),),
        remaining_before=3,
        remaining_after=1,
        overage_after=2,
        overage_before=2,
    )
    empty = Pot([Balance("g", 3, 3, 0, None)])
    assert fit_window(4, 7, 1, 2, empty, 0, soft=True) == WindowFit(
        fits=False,
        draws=(),
        remaining_before=0,
        remaining_after=0,
        overage_after=4,
        overage_before=2,
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "amount: must be between 1 and 1000000000000000, got 0"),
        (-1, "amount: must be between 1 and 1000000000000000, got -1"),
        (10**15 + 1, "amount: must be between 1 and 1000000000000000, got 1000000000000001"),
        (True, "amount: must be a whole number, got True"),
        (2.0, "amount: must be a whole number, got 2.0"),
        ("3", "amount: must be a whole number, got '3'"),
        (None, "amount: must be a whole number, got None"),
    ],
)
def test_an_amount_is_a_whole_number_from_one_to_the_ceiling(value: object, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_amount("amount", value)
    assert str(raised.value) == message
    assert raised.value.field == "amount"


def test_an_amount_may_be_one_or_the_ceiling() -> None:
    assert validate_amount("amount", 1) == 1
    assert validate_amount("amount", 10**15) == 10**15
    assert validate_amount("maximum", 7, ceiling=7) == 7
    with pytest.raises(InvalidInput, match=r"^maximum: must be between 1 and 7, got 8$"):
        validate_amount("maximum", 8, ceiling=7)


def test_a_grant_id_is_1_to_128_characters_of_a_small_alphabet() -> None:
    allowed = "Az09_.:@/+=-"
    assert validate_grant_id(allowed) == allowed
    assert validate_grant_id("g" * 128) == "g" * 128
    assert validate_grant_id("x", "id") == "x"
    for bad in ("", "a b", "é", "a\n", 7, None):
        with pytest.raises(InvalidInput) as raised:
            validate_grant_id(bad)
        assert str(raised.value) == (
            f"grant_id: {bad!r} must be 1 to 128 of A-Z a-z 0-9 and _ . : @ / + = -"
        )
    with pytest.raises(InvalidInput, match=r"^grant_id: 'ggg"):
        validate_grant_id("g" * 129)
    with pytest.raises(InvalidInput) as raised:
        validate_grant_id("a b", "id")
    assert raised.value.field == "id"


def test_an_entitlement_as_a_document() -> None:
    change = Entitlement("org", "calls", 20, NOW_US, NOW_US + 1)
    assert change.to_dict() == {
        "subject": "org",
        "limit": "calls",
        "maximum": 20,
        "effective_from": "2026-11-23T12:00:00+00:00",
        "created_at": "2026-11-23T12:00:00.000001+00:00",
    }
    assert Entitlement("org", "calls", None, 0).to_dict()["maximum"] is None
