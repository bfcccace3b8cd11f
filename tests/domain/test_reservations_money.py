"""The money a commit of fewer priced units keeps (`committed_money`).

The units kept are the first of those reserved: priced at the positions the
reserve priced, at the price in force at the event's time; a spend charge
keeps the sum of its subject's kept amounts in its currency. A price that no
longer gives what the reserve charged is refused.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.domain.decisions import ChargeDecision
from metering.domain.money import Price, tiered_amount
from metering.domain.reservations import committed_money
from metering.errors import InvalidInput

MICRO = 1_000_000  # a minor unit, in micro-minor units
T0 = 1_800_000_000_000_000
CURRENCIES = {"usd_cap": "USD"}


def _charge(
    limit: str, cost: int, used: int, price: int | None, subject: str = "org"
) -> ChargeDecision:
    return ChargeDecision(
        subject,
        limit,
        cost,
        True,
        "allowed",
        used,
        100,
        1_000,
        0,
        T0,
        T0 + 3_600_000_000,
        None,
        price=("USD", price) if price is not None else None,
    )


GRADUATED = Price(
    "tokens", "USD", None, 0, model="graduated", tiers=((5, 2 * MICRO), (None, MICRO)), flat_fee=50
)
VOLUME = Price("images", "USD", None, 0, model="volume", tiers=((3, 10 * MICRO), (None, 3 * MICRO)))
PER_UNIT = Price("calls", "USD", 2 * MICRO, 0)
PRICES = {"tokens": (GRADUATED,), "images": (VOLUME,), "calls": (PER_UNIT,)}


def test_the_first_units_kept_keep_their_tiers_and_the_fee() -> None:
    charges = [
        _charge("tokens", 4, 7, 6),  # units 4-7: two at 2 cents, two at 1
        _charge("calls", 3, 3, 6),
        _charge("plain", 5, 5, None),
        _charge("usd_cap", 12, 12, None),
    ]
    kept = [3, 1, 5, 0]
    assert committed_money(charges, kept, PRICES, CURRENCIES, T0) == [5, 2, 5, 7]
    opening = [_charge("tokens", 2, 2, 54), _charge("usd_cap", 54, 54, None)]
    assert committed_money(opening, [1, 0], PRICES, CURRENCIES, T0) == [52, 52]
    assert committed_money(opening, [0, 0], PRICES, CURRENCIES, T0) == [0, 0]


def test_a_volume_price_keeps_the_highest_price_the_kept_units_reached() -> None:
    # Up to 3 units at 10 cents, then every unit at 3: 4 units cost 30 (12 < 30).
    charges = [_charge("images", 2, 4, 10), _charge("usd_cap", 10, 10, None)]  # 20 to 30
    assert committed_money(charges, [1, 0], PRICES, CURRENCIES, T0) == [10, 10]  # 3 units: 30
    assert committed_money(charges, [0, 0], PRICES, CURRENCIES, T0) == [0, 0]
    charges = [_charge("images", 10, 12, 16), _charge("usd_cap", 16, 16, None)]  # 20 to 36
    assert committed_money(charges, [9, 0], PRICES, CURRENCIES, T0) == [13, 13]  # 11: 33


def test_each_subject_and_currency_keeps_its_own_sum() -> None:
    charges = [
        _charge("calls", 3, 3, 6, "a"),
        _charge("calls", 2, 2, 4, "b"),
        _charge("usd_cap", 6, 6, None, "a"),
        _charge("usd_cap", 4, 4, None, "b"),
    ]
    assert committed_money(charges, [1, 2, 0, 0], PRICES, CURRENCIES, T0) == [2, 4, 2, 4]


def test_a_price_that_no_longer_gives_the_reserved_amount_is_refused() -> None:
    charges = [_charge("calls", 3, 3, 6), _charge("usd_cap", 6, 6, None)]
    dearer = {"calls": (Price("calls", "USD", 3 * MICRO, 0),)}
    with pytest.raises(InvalidInput, match="price changed since it was reserved"):
        committed_money(charges, [1, 0], dearer, CURRENCIES, T0)
    with pytest.raises(InvalidInput, match="price changed"):  # no price in force at its time
        committed_money(charges, [1, 0], PRICES, CURRENCIES, -1)


@given(before=st.integers(0, 20), cost=st.integers(1, 20), data=st.data())
def test_the_money_kept_is_the_reserve_priced_for_fewer_units(
    before: int, cost: int, data: st.DataObject
) -> None:
    keep = data.draw(st.integers(0, cost))
    price = data.draw(st.sampled_from([GRADUATED, VOLUME, PER_UNIT]))
    reserved = tiered_amount(price, before, cost)
    charges = [
        _charge(price.limit, cost, before + cost, reserved),
        _charge("usd_cap", reserved, reserved, None),
    ]
    found = committed_money(charges, [keep, 0], PRICES, CURRENCIES, T0)
    assert found[0] == found[1] == tiered_amount(price, before, keep) <= reserved


def test_the_refusal_says_what_to_do_instead() -> None:
    charges = [_charge("calls", 3, 3, 6), _charge("usd_cap", 6, 6, None)]
    dearer = {"calls": (Price("calls", "USD", 3 * MICRO, 0),)}
    with pytest.raises(InvalidInput) as refused:
        committed_money(charges, [1, 0], dearer, CURRENCIES, T0)
    assert (refused.value.field, str(refused.value)) == (
        "actual",
        "actual: its price changed since it was reserved (a price set since, in force at "
        "its time): the money cannot be split; commit it in full or cancel it",
    )


def test_a_spend_charge_of_a_subject_with_nothing_priced_keeps_nothing() -> None:
    charges = [_charge("calls", 3, 3, 6, "a"), _charge("usd_cap", 5, 5, None, "b")]
    assert committed_money(charges, [1, 0], PRICES, CURRENCIES, T0) == [2, 0]
