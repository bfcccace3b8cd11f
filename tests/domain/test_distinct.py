"""Seats' pure rules (`metering.domain.distinct`), a cost of 0 in a fixed
window, and `Limit(distinct=...)`'s validation."""

from __future__ import annotations

from typing import Any

import pytest

from metering.domain.decisions import ChargeInput, decide_event
from metering.domain.distinct import (
    MAX_VALUE_CHARS,
    after_void,
    seat_cost,
    value_of,
)
from metering.domain.grants import Balance, Pot
from metering.domain.limits import Limit
from metering.domain.rules import Rule
from metering.domain.state import CounterKey, CounterState
from metering.domain.windows import evaluate_window
from metering.errors import InvalidInput, InvalidLimit

SEAT = ("seats", "org-1", 0, "ann")


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"user": "ann"}, "ann"),
        ({"user": 7, "other": None}, "7"),
        ({"user": -3}, "-3"),
        ({"user": "x" * MAX_VALUE_CHARS}, "x" * MAX_VALUE_CHARS),
        ({"user": "ünï cödé"}, "ünï cödé"),
    ],
)
def test_the_value_of_a_charge(metadata: dict[str, Any], expected: str) -> None:
    assert value_of("user", "seats", metadata, 1) == expected


@pytest.mark.parametrize(
    ("metadata", "cost", "field"),
    [
        (None, 1, "metadata"),
        ({}, 1, "metadata"),
        ({"User": "a"}, 1, "metadata"),
        ({"user": None}, 1, "metadata"),
        ({"user": ""}, 1, "metadata"),
        ({"user": True}, 1, "metadata"),
        ({"user": 1.0}, 1, "metadata"),
        ({"user": {"id": 1}}, 1, "metadata"),
        ({"user": "a\nb"}, 1, "metadata"),
        ({"user": "x" * (MAX_VALUE_CHARS + 1)}, 1, "metadata"),
        ({"user": "a"}, 2, "cost"),
        ({"user": "a"}, 0, "cost"),
    ],
)
def test_a_charge_without_a_good_value_is_invalid(
    metadata: dict[str, Any] | None, cost: int, field: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        value_of("user", "seats", metadata, cost)
    assert caught.value.field == field
    assert "'seats'" in str(caught.value) or "'user'" in str(caught.value)


def test_a_value_costs_one_seat_until_it_has_a_live_event() -> None:
    assert seat_cost({}, SEAT) == 1
    assert seat_cost({SEAT: 0}, SEAT) == 1
    assert seat_cost({SEAT: 1}, SEAT) == 0
    assert seat_cost({SEAT: 5}, SEAT) == 0
    assert seat_cost({SEAT: 5}, ("seats", "org-1", 0, "bob")) == 1
    assert seat_cost({SEAT: 5}, ("seats", "org-1", 1, "ann")) == 1  # another window


def test_a_void_frees_the_seat_with_the_last_live_event_only() -> None:
    # A held row (1) is told whether the ledger has other live events.
    assert after_void(1, others=1) == (1, 0)
    assert after_void(1, others=0) == (0, 1)
    assert after_void(0, others=0) == (0, 0)  # a reset cleared it: nothing to free
    assert after_void(0, others=1) == (0, 0)


def test_a_held_seat_fits_whatever_the_maximum() -> None:
    limit = Limit("seats", maximum=2, period="1h", distinct="user")
    over = CounterState(used=3)  # an entitlement lowered below the seats held
    held = evaluate_window(limit, over, 0, (0, 10), 5)
    assert (held.fits, held.used_after, held.remaining_after) == (True, 3, 0)
    assert not evaluate_window(limit, over, 1, (0, 10), 5).fits
    pot = Pot([Balance("g", 1, 1, 0, None)])  # a spent grant
    assert evaluate_window(limit, over, 0, (0, 10), 5, pot).fits
    assert not evaluate_window(limit, over, 1, (0, 10), 5, pot).fits


@pytest.mark.parametrize("enforcement", ["hard", "soft"])
@pytest.mark.parametrize("granted", [False, True])
def test_a_held_seat_past_the_maximum_is_allowed_with_no_overage(
    enforcement: str, granted: bool
) -> None:
    """A repeat is free: outcome allowed and overage 0, even past the maximum
    (a soft limit's, or a hard one's after a downgrade), with or without grants."""
    limit = Limit("seats", maximum=2, period="1h", distinct="user", enforcement=enforcement)
    pot = Pot([Balance("g", 1, 0, 0, None)]) if granted else None
    charge = ChargeInput(limit, CounterKey("seats", "org-1", 0, 10), CounterState(used=3), 0, pot)
    verdict = decide_event([charge], 5)
    (decided,) = verdict.charges
    assert (verdict.outcome, decided.outcome, decided.overage) == ("allowed", "allowed", 0)
    assert (decided.used, decided.grants, verdict.new_states[0].used) == (3, (), 3)


def test_a_new_seat_after_a_downgrade_is_denied_whatever_the_grants() -> None:
    """Maximum 3, 3 seats held, lowered to 1, a grant of 1: a new seat is denied."""
    limit = Limit("seats", maximum=1, period="1h", distinct="user")
    pot = Pot([Balance("g", 1, 0, 0, None)])
    charge = ChargeInput(limit, CounterKey("seats", "org-1", 0, 10), CounterState(used=3), 1, pot)
    verdict = decide_event([charge], 5)
    (decided,) = verdict.charges
    assert (verdict.outcome, decided.used, decided.remaining, decided.grants) == (
        "denied",
        3,
        0,
        (),
    )
    assert verdict.new_states[0].used == 3 and pot.balances[0].used == 0


def test_a_seat_limit_is_a_fixed_window_with_a_key() -> None:
    limit = Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user.id")
    assert limit.distinct == "user.id" and limit.to_dict()["distinct"] == "user.id"
    assert Limit.from_dict(limit.to_dict()) == limit
    assert Limit("plain", maximum=5, period="1h").to_dict()["distinct"] is None
    assert Rule.of(limit).distinct and not Rule.of(Limit("plain", maximum=5, period="1h")).distinct


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"algorithm": "token_bucket", "period": "10s"}, "token bucket has no windows"),
        ({"distinct": ""}, "must be 1 to 64"),
        ({"distinct": "x" * 65}, "must be 1 to 64"),
        ({"distinct": "a/b"}, "must be 1 to 64"),
        ({"distinct": ["user"]}, "must be 1 to 64"),
    ],
)
def test_a_broken_seat_limit_names_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidLimit, match=message) as caught:
        Limit(**{"name": "seats", "maximum": 5, "period": "1h", "distinct": "user", **fields})
    assert caught.value.field == "distinct"


@pytest.mark.parametrize(
    ("metadata", "cost", "field", "message"),
    [
        (
            None,
            1,
            "metadata",
            "limit 'seats' counts distinct values of 'user': the event's metadata must carry it",
        ),
        (
            {"user": ""},
            1,
            "metadata",
            "'user' must be a whole number or 1 to 200 printable characters, got ''",
        ),
        (
            {"user": "a"},
            2,
            "cost",
            "a charge on 'seats' counts distinct 'user' values: its cost must be 1",
        ),
    ],
)
def test_a_bad_seat_charge_says_exactly_why(
    metadata: dict[str, Any] | None, cost: int, field: str, message: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        value_of("user", "seats", metadata, cost)
    assert (raised.value.field, str(raised.value)) == (field, f"{field}: {message}")
