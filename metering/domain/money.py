"""Money: currencies, amounts, prices and the rounding of a priced charge (docs/money.md).

Amounts are integers of a currency's minor unit (`CURRENCIES`): `parse_amount` reads the
major units a person writes and refuses more decimals than the currency has; `format_amount`
writes them back; text goes through `Decimal`, never a float. A price is an integer of
micro-minor units (`PRICE_EXTRA_DIGITS` below the minor unit: USD 0.002 a call is 200,000).
A charge's amount is ``cost * per_unit`` rounded half to even to the minor unit, per charge
(`charge_amount`); a spend limit is charged the sum of its event's rounded amounts, at most
`MAX_AMOUNT` a charge (`bounded_amount`). Prices are effective-dated (`price_at`): one holds
until the next of its limit; a price of None ends pricing from then on.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Final

from metering.domain.bounds import shown
from metering.domain.instants import from_us
from metering.errors import InvalidInput

# ISO 4217 codes with their minor-unit digits (a selection; add as needed).
CURRENCIES: Final[Mapping[str, int]] = {
    "AUD": 2,
    "BHD": 3,
    "BRL": 2,
    "CAD": 2,
    "CHF": 2,
    "CLP": 0,
    "CNY": 2,
    "CZK": 2,
    "DKK": 2,
    "EUR": 2,
    "GBP": 2,
    "HKD": 2,
    "HUF": 2,
    "IDR": 2,
    "ILS": 2,
    "INR": 2,
    "ISK": 0,
    "JOD": 3,
    "JPY": 0,
    "KRW": 0,
    "KWD": 3,
    "MXN": 2,
    "NOK": 2,
    "NZD": 2,
    "OMR": 3,
    "PLN": 2,
    "SEK": 2,
    "SGD": 2,
    "TND": 3,
    "TRY": 2,
    "TWD": 2,
    "USD": 2,
    "VND": 0,
    "ZAR": 2,
}
# Decimals of a per-unit price below the minor unit.
PRICE_EXTRA_DIGITS: Final = 6
PRICE_SCALE: Final = 10**PRICE_EXTRA_DIGITS
# Amounts and prices, in their integer units, fit a BIGINT with room to multiply.
MAX_AMOUNT: Final = 10**15
MAX_PRICE: Final = 10**15
_NUMBER: Final = re.compile(r"[0-9]+(\.[0-9]+)?")


def validate_currency(code: object) -> str:
    """An ISO 4217 code this product knows (`CURRENCIES`), upper case."""
    if not isinstance(code, str) or code.strip().upper() not in CURRENCIES:
        raise InvalidInput(
            "currency", f"unknown currency {shown(code)}; use an ISO 4217 code such as USD"
        )
    return code.strip().upper()


def minor_digits(currency: str) -> int:
    return CURRENCIES[validate_currency(currency)]


def _decimal(field_name: str, value: object) -> Decimal:
    if isinstance(value, bool | float):
        raise InvalidInput(field_name, f"give an exact decimal (text), not {shown(value)}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidInput(field_name, f"{shown(value)} is not an amount")
        return value
    if not isinstance(value, str) or _NUMBER.fullmatch(value.strip()) is None:
        raise InvalidInput(field_name, f"{shown(value)} is not an amount like 50 or 1.00")
    try:
        return Decimal(value.strip())
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimals
        raise InvalidInput(field_name, f"{shown(value)} is not an amount") from exc


def _scaled(field_name: str, value: object, digits: int, ceiling: int) -> int:
    number = _decimal(field_name, value)
    if number < 0:
        raise InvalidInput(field_name, f"{shown(value)} must not be negative")
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > digits and number != number.quantize(Decimal(1).scaleb(-digits)):
        raise InvalidInput(field_name, f"{shown(value)} has more than {digits} decimals")
    scaled = int(number.scaleb(digits))
    if scaled > ceiling:
        raise InvalidInput(field_name, f"{shown(value)} is too large")
    return scaled


def parse_amount(value: object, currency: str, *, field_name: str = "amount") -> int:
    """Major units (``"50"``, ``"1.00"``, an int or a `Decimal`) as minor units."""
    return _scaled(field_name, value, minor_digits(currency), MAX_AMOUNT)


def format_amount(minor: int, currency: str) -> str:
    """Minor units as major units with the currency's decimals: 5000 USD is ``"50.00"``."""
    digits = minor_digits(currency)
    return str(Decimal(minor).scaleb(-digits).quantize(Decimal(1).scaleb(-digits)))


def parse_price(value: object, currency: str) -> int:
    """A per-unit price in major units as micro-minor units (see the module's docstring)."""
    return _scaled("per_unit", value, minor_digits(currency) + PRICE_EXTRA_DIGITS, MAX_PRICE)


def format_price(micro_minor: int, currency: str) -> str:
    """A per-unit price in major units, without trailing zeros beyond the minor unit."""
    digits = minor_digits(currency)
    exact = Decimal(micro_minor).scaleb(-(digits + PRICE_EXTRA_DIGITS))
    text = str(exact.quantize(Decimal(1).scaleb(-(digits + PRICE_EXTRA_DIGITS))))
    if "." in text:
        whole, fraction = text.split(".")
        fraction = fraction.rstrip("0").ljust(digits, "0")
        return f"{whole}.{fraction}" if fraction else whole
    return text


def charge_amount(cost: int, per_unit: int) -> int:
    """The minor units a charge of ``cost`` units costs at ``per_unit`` micro-minor
    units a unit: exact product, rounded half to even at the minor unit.

    >>> charge_amount(1, 500_000)   # half a cent: to the even 0
    0
    >>> charge_amount(3, 500_000)   # 1.5 cents: to the even 2
    2
    """
    whole, rest = divmod(cost * per_unit, PRICE_SCALE)
    twice = 2 * rest
    if twice > PRICE_SCALE or (twice == PRICE_SCALE and whole % 2 == 1):
        whole += 1
    return whole


@dataclass(frozen=True, slots=True)
class Price:
    """A limit's price per unit from ``effective_from_us`` on (None: no price from then)."""

    limit: str
    currency: str
    per_unit: int | None
    effective_from_us: int
    created_at_us: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "limit": self.limit,
            "currency": self.currency,
            "per_unit": None
            if self.per_unit is None
            else format_price(self.per_unit, self.currency),
            "per_unit_micro_minor": self.per_unit,
            "effective_from": from_us(self.effective_from_us).isoformat(),
        }


# A limit's prices, sorted by effective_from_us.
PriceHistory = Sequence[Price]


def price_at(history: PriceHistory, at_us: int) -> Price | None:
    """The price in force at ``at_us``: the last one effective by then, if it prices."""
    index = bisect_right([p.effective_from_us for p in history], at_us)
    if index == 0:
        return None
    found = history[index - 1]
    return found if found.per_unit is not None else None


@dataclass(frozen=True, slots=True)
class PricedCharge:
    """What one charge costs: its position in the event, currency and amount (minor units)."""

    index: int
    subject: str
    currency: str
    amount: int


def bounded_amount(cost: int, price: Price) -> int:
    """`charge_amount` of ``cost`` units at ``price``, at most `MAX_AMOUNT`
    (so an event's sums fit a BIGINT), else `InvalidInput` naming the cost."""
    assert price.per_unit is not None
    amount = charge_amount(cost, price.per_unit)
    if amount > MAX_AMOUNT:
        currency = price.currency
        raise InvalidInput(
            "cost",
            f"{cost:,} units of {price.limit!r} at {format_price(price.per_unit, currency)} "
            f"{currency} a unit cost more than {format_amount(MAX_AMOUNT, currency)} "
            f"{currency}, the most one charge may cost",
        )
    return amount


def priced_charges(
    charges: Iterable[tuple[str, str, int]],
    prices: Mapping[str, PriceHistory],
    at_us: int,
) -> list[PricedCharge]:
    """The event's charges (subject, limit, cost) that have a price at ``at_us``, each
    rounded on its own; `InvalidInput` when one costs more than `MAX_AMOUNT`."""
    found: list[PricedCharge] = []
    for index, (subject, limit, cost) in enumerate(charges):
        price = price_at(prices.get(limit, ()), at_us)
        if price is not None and price.per_unit is not None:
            amount = bounded_amount(cost, price)
            found.append(PricedCharge(index, subject, price.currency, amount))
    return found


def spend_charges(
    priced: Iterable[PricedCharge], spend_limits: Mapping[str, Sequence[str]]
) -> list[tuple[str, str, int]]:
    """The charges (subject, spend limit, amount) an event adds: per subject and
    spend limit of the charge's currency, the sum of its rounded amounts.
    Zero sums add nothing."""
    totals: dict[tuple[str, str], int] = {}
    for charge in priced:
        for limit in spend_limits.get(charge.currency, ()):
            key = (charge.subject, limit)
            totals[key] = totals.get(key, 0) + charge.amount
    return [(subject, limit, amount) for (subject, limit), amount in totals.items() if amount]


__all__ = [
    "CURRENCIES",
    "MAX_AMOUNT",
    "PRICE_EXTRA_DIGITS",
    "Price",
    "PricedCharge",
    "bounded_amount",
    "charge_amount",
    "format_amount",
    "format_price",
    "parse_amount",
    "parse_price",
    "price_at",
    "priced_charges",
    "spend_charges",
    "validate_currency",
]
