"""The pure rules of money (metering.domain.money): currencies, amounts,
prices, half-even rounding per charge, prices in force, spend charges."""

from __future__ import annotations

from dataclasses import replace
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.domain.decisions import ChargeDecision, ChargeInput, decide_event
from metering.domain.limits import Limit, spend_limit
from metering.domain.money import (
    MAX_AMOUNT,
    Price,
    PricedCharge,
    charge_amount,
    format_amount,
    format_price,
    parse_amount,
    parse_price,
    price_at,
    priced_charges,
    prices_from,
    spend_charges,
    validate_currency,
)
from metering.domain.state import CounterKey, CounterState
from metering.errors import InvalidInput, InvalidLimit


@pytest.mark.parametrize(
    ("cost", "per_unit", "cents"),
    [
        (1, "0.005", 0),  # half a cent: to the even 0
        (3, "0.005", 2),  # 1.5 cents: to the even 2
        (5, "0.005", 2),  # 2.5 cents: to the even 2
        (7, "0.005", 4),  # 3.5 cents: to the even 4
        (1, "0.0051", 1),  # just above half: up
        (1, "0.0049", 0),  # just below half: down
        (10, "0.002", 2),
        (1, "0.00000001", 0),
        (1, "0.125", 12),  # 12.5: to the even 12
        (1, "0.135", 14),  # 13.5: to the even 14
        (1000, "1.5", 150_000),
    ],
)
def test_a_charge_is_rounded_half_to_even_at_the_cent(cost: int, per_unit: str, cents: int) -> None:
    assert charge_amount(cost, parse_price(per_unit, "USD")) == cents


@given(st.integers(1, 10**9), st.integers(0, 10**12))
def test_rounding_equals_decimal_half_even(cost: int, micro: int) -> None:
    exact = Decimal(cost) * Decimal(micro) / Decimal(10**6)
    assert charge_amount(cost, micro) == int(exact.quantize(Decimal(1), ROUND_HALF_EVEN))


def test_each_charge_is_rounded_on_its_own_then_summed() -> None:
    """Two charges of half a cent each cost 0 + 0, not a rounded 1 cent."""
    prices = {"a": (Price("a", "USD", parse_price("0.005", "USD"), 0),)}
    prices["b"] = (Price("b", "USD", parse_price("0.005", "USD"), 0),)
    priced = priced_charges([("s", "a", 1), ("s", "b", 1)], prices, 10)
    assert [c.amount for c in priced] == [0, 0]
    assert spend_charges(priced, {"USD": ["spend"]}) == []
    priced = priced_charges([("s", "a", 3), ("s", "b", 1), ("t", "b", 5)], prices, 10)
    assert spend_charges(priced, {"USD": ["spend", "daily"], "EUR": ["eu"]}) == [
        ("s", "spend", 2),
        ("s", "daily", 2),
        ("t", "spend", 2),
        ("t", "daily", 2),
    ]


def test_amounts_in_major_units_and_back() -> None:
    assert parse_amount("50", "USD") == 5000
    assert parse_amount("1.00", "USD") == 100
    assert parse_amount("1.5", "USD") == 150
    assert parse_amount(Decimal("0.01"), "USD") == 1
    assert parse_amount(7, "USD") == 700
    assert parse_amount("500", "JPY") == 500
    assert parse_amount("1.234", "KWD") == 1234
    assert format_amount(5000, "USD") == "50.00"
    assert format_amount(1, "USD") == "0.01"
    assert format_amount(500, "JPY") == "500"
    assert format_amount(1234, "KWD") == "1.234"


def test_prices_hold_six_decimals_below_the_minor_unit() -> None:
    assert parse_price("0.002", "USD") == 200_000
    assert parse_price("0.00000001", "USD") == 1
    assert parse_price("0.000001", "JPY") == 1
    assert format_price(200_000, "USD") == "0.002"
    assert format_price(100_000_000, "USD") == "1.00"
    assert format_price(1, "JPY") == "0.000001"
    assert format_price(5_000_000, "JPY") == "5"


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (lambda: parse_amount("1.001", "USD"), "amount", "more than 2 decimals"),
        (lambda: parse_amount("1.5", "JPY"), "amount", "more than 0 decimals"),
        (lambda: parse_amount(1.5, "USD"), "amount", "exact decimal"),
        (lambda: parse_amount("-1", "USD"), "amount", "not an amount"),
        (lambda: parse_amount("1e3", "USD"), "amount", "not an amount"),
        (lambda: parse_amount("", "USD"), "amount", "not an amount"),
        (lambda: parse_amount(Decimal("NaN"), "USD"), "amount", "not an amount"),
        (lambda: parse_amount("1" * 30, "USD"), "amount", "too large"),
        (lambda: parse_price("0.000000001", "USD"), "per_unit", "more than 8 decimals"),
        (lambda: parse_price("0.0000001", "JPY"), "per_unit", "more than 6 decimals"),
        (lambda: validate_currency("XXX"), "currency", "unknown currency"),
        (lambda: validate_currency(None), "currency", "unknown currency"),
        (lambda: parse_amount("1", "usd?"), "currency", "unknown currency"),
    ],
)
def test_bad_money_is_a_clear_error(call: object, field: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        call()  # type: ignore[operator]
    assert caught.value.field == field
    assert words in caught.value.message


def test_trailing_zeros_are_not_more_decimals() -> None:
    assert parse_amount("1.000", "USD") == 100
    assert validate_currency("usd") == "USD"


def test_the_price_in_force_is_the_last_one_effective() -> None:
    history = (
        Price("a", "USD", 100, 10),
        Price("a", "USD", None, 20),
        Price("a", "USD", 300, 30),
    )
    assert price_at(history, 9) is None
    assert price_at(history, 10) == history[0]
    assert price_at(history, 19) == history[0]
    assert price_at(history, 20) is None  # the price ended
    assert price_at(history, 31) == history[2]
    assert price_at((), 31) is None


def test_the_prices_from_an_instant_are_the_one_in_force_and_those_after_it() -> None:
    history = (
        Price("a", "USD", 100, 10),
        Price("a", "EUR", 5, 12),
        Price("a", "USD", None, 20),
        Price("a", "EUR", None, 25),
        Price("a", "USD", 300, 30),
    )
    assert prices_from(history, 0) == [history[0], history[4], history[1]]
    assert prices_from(history, 15) == [history[0], history[4], history[1]]
    assert prices_from(history, 22) == [history[4], history[1]]  # USD ended at 20, again at 30
    assert prices_from(history, 26) == [history[4]]  # EUR ended for good at 25
    assert prices_from(history[:4], 26) == []
    assert prices_from((), 0) == []


def test_a_spend_limit_holds_minor_units() -> None:
    limit = spend_limit("spend", "50", "usd", "1mo", window="calendar")
    assert (limit.maximum, limit.currency) == (5000, "USD")
    assert limit.to_dict()["max_amount"] == "50.00"
    assert Limit.from_dict(limit.to_dict()) == limit
    assert Limit.from_dict({"name": "s", "max_amount": "1", "currency": "JPY", "period": "1d"})
    with pytest.raises(InvalidLimit, match="a bucket"):
        Limit("s", 10, "10s", algorithm="token_bucket", currency="USD")
    with pytest.raises(InvalidLimit, match="more than 0"):
        spend_limit("s", "0", "USD", "1d")
    with pytest.raises(InvalidLimit, match="needs a currency"):
        Limit.from_dict({"name": "s", "max_amount": "1", "period": "1d"})
    with pytest.raises(InvalidInput, match="unknown currency"):
        spend_limit("s", "1", "XYZ", "1d")


def test_a_priced_charge_keeps_its_price_in_the_ledger_row() -> None:
    charge = ChargeDecision("s", "a", 3, True, "allowed", 3, 7, 10, 0, 0, 100, None)
    priced = ChargeDecision(*ChargeDecision.to_row(charge)[:12], (), ("USD", 2))  # type: ignore[misc]
    assert ChargeDecision.from_row(priced.to_row()) == priced
    assert ChargeDecision.from_row(charge.to_row()) == charge
    assert priced.to_dict()["amount"] == "0.02"
    assert "amount" not in charge.to_dict()


def test_a_price_as_a_dict() -> None:
    at_us = 1_800_000_000_000_000
    assert Price("api", "EUR", 1_234_500, at_us).to_dict() == {
        "limit": "api",
        "currency": "EUR",
        "per_unit": "0.012345",
        "per_unit_micro_minor": 1_234_500,
        "effective_from": "2027-01-15T08:00:00+00:00",
        "model": "per_unit",
    }
    assert Price("api", "JPY", None, at_us).to_dict() == {
        "limit": "api",
        "currency": "JPY",
        "per_unit": None,
        "per_unit_micro_minor": None,
        "effective_from": "2027-01-15T08:00:00+00:00",
        "model": "per_unit",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "give an exact decimal (text), not True"),
        (1.5, "give an exact decimal (text), not 1.5"),
        (Decimal("NaN"), "Decimal('NaN') is not an amount"),
        ("1,5", "'1,5' is not an amount like 50 or 1.00"),
        (-1, "-1 must not be negative"),
        ("1.001", "'1.001' has more than 2 decimals"),
        ("10000000000000.01", "'10000000000000.01' is too large"),
    ],
)
def test_a_bad_amount_says_which_and_why(value: object, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_amount(value, "EUR")
    assert (raised.value.field, str(raised.value)) == ("amount", f"amount: {message}")


def test_an_unknown_currency_is_named() -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_currency("XYZ")
    assert str(raised.value) == "currency: unknown currency 'XYZ'; use an ISO 4217 code such as USD"


def test_the_largest_amount_and_a_price_of_one_decimal() -> None:
    assert parse_amount("10000000000000.00", "EUR") == 10**15
    assert format_price(parse_price("0.1", "EUR"), "EUR") == "0.10"


def test_unpriced_limits_cost_nothing_and_spend_only_in_its_currency() -> None:
    prices = {
        "api": [Price("api", "EUR", 1_000_000, 0)],
        "yen": [Price("yen", "JPY", 5_000_000, 0)],
    }
    priced = priced_charges([("s", "free", 3), ("s", "api", 3), ("t", "yen", 2)], prices, 10)
    assert priced == [PricedCharge(1, "s", "EUR", 3), PricedCharge(2, "t", "JPY", 10)]
    assert spend_charges(priced, {"EUR": ["spend"]}) == [("s", "spend", 3)]


def test_an_overdraft_follows_the_price_in_the_row_and_the_dict() -> None:
    base = ChargeDecision("s", "a", 3, True, "allowed", 12, 0, 10, 0, 0, 100, None)
    over = replace(base, overdraft=2)
    assert over.to_row()[12:] == [[], None, 2]
    assert ChargeDecision.from_row(over.to_row()) == over
    both = replace(base, price=("USD", 250), overdraft=2)
    assert both.to_row()[12:] == [[], ["USD", 250], 2]
    assert ChargeDecision.from_row(both.to_row()) == both
    assert ChargeDecision.from_row(replace(base, price=("USD", 250)).to_row()).overdraft == 0
    shown = both.to_dict()
    assert {k: shown[k] for k in ("currency", "amount", "overdraft")} == {
        "currency": "USD",
        "amount": "2.50",
        "overdraft": 2,
    }
    assert "overdraft" not in base.to_dict()


def test_a_charge_keeps_its_price_only_when_consumed() -> None:
    limit = Limit("a", maximum=5, period="1m")
    key = CounterKey("a", "s", 0, 60_000_000)
    fits = ChargeInput(limit, key, CounterState(), 3, price=("USD", 30))
    denied = ChargeInput(limit, key, CounterState(), 9, price=("USD", 90))
    assert decide_event([fits], 0).charges[0].price == ("USD", 30)
    assert decide_event([denied], 0).charges[0].price is None


def test_a_charge_costing_more_than_the_largest_amount_is_refused() -> None:
    """The amount is bounded where it is computed: at most `MAX_AMOUNT` minor units."""
    top = parse_price("10000000", "USD")  # ten million dollars a unit
    prices = {"big": (Price("big", "USD", top, 0),)}
    assert charge_amount(10**6, top) == MAX_AMOUNT  # ten trillion dollars: the largest
    [fits] = priced_charges([("s", "big", 10**6)], prices, 10)
    assert fits.amount == MAX_AMOUNT
    for cost in (10**6 + 1, 10**10, 10**12):
        with pytest.raises(InvalidInput) as refused:
            priced_charges([("s", "free", 1), ("s", "big", cost)], prices, 10)
        assert refused.value.field == "cost"
        assert str(refused.value) == (
            f"cost: {cost:,} units of 'big' at 10000000.00 USD a unit cost more "
            "than 10000000000000.00 USD, the most one charge may cost"
        )
