"""Money: currencies, amounts, prices and the rounding of a priced charge (docs/money.md).

Amounts are integers of a currency's minor unit (`CURRENCIES`), read and written through
`Decimal` (`parse_amount`, `format_amount`); prices are integers of micro-minor units
(`PRICE_EXTRA_DIGITS` below the minor unit). A per-unit charge is ``cost * per_unit``
rounded half to even per charge (`charge_amount`, at most `MAX_AMOUNT`: `bounded_amount`);
a tiered price (`MODELS`) and a flat fee price the window's total (`window_price`), and a
charge costs the rounded price after it less that before it (`tiered_amount`). Prices are
effective-dated (`price_at`); a price of None ends pricing from then on.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from itertools import pairwise
from operator import attrgetter
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
# How a price turns a window's units into money.
MODELS: Final = ("per_unit", "graduated", "volume", "package")
MAX_TIERS: Final = 32
# A tier: the window total it prices up to (None: no end), its price per unit (micro-minor).
Tier = tuple[int | None, int]


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


def round_micro(micro_minor: int) -> int:
    """Micro-minor units to minor units, half to even (`charge_amount`'s rounding)."""
    return charge_amount(micro_minor, 1)


@dataclass(frozen=True, slots=True)
class Price:
    """A limit's price from ``effective_from_us`` on (``per_unit`` None with the
    ``per_unit`` model: no price from then).

    ``model``: ``per_unit`` (``per_unit`` micro-minor units a unit); ``graduated``
    (each unit of the window at its tier's price) or ``volume`` (every unit of the
    window at the price of the tier its total reaches), ``tiers`` sorted by their end,
    the last without one; ``package`` (``per_package`` micro-minor units per block of
    ``package`` units of the window, rounded up). ``flat_fee`` (minor units) is
    charged once per window, with the charge that starts its total.
    """

    limit: str
    currency: str
    per_unit: int | None
    effective_from_us: int
    created_at_us: int = 0
    model: str = "per_unit"
    tiers: tuple[Tier, ...] = ()
    package: int | None = None
    per_package: int | None = None
    flat_fee: int = 0

    @property
    def prices(self) -> bool:
        """Whether it prices (a removal does not)."""
        return self.per_unit is not None or self.model != "per_unit"

    @property
    def counted(self) -> bool:
        """Whether a charge's amount depends on its window's total (tiers, a flat fee)."""
        return self.model != "per_unit" or self.flat_fee > 0

    def to_dict(self) -> dict[str, object]:
        currency = self.currency
        found: dict[str, object] = {
            "limit": self.limit,
            "currency": currency,
            "per_unit": None if self.per_unit is None else format_price(self.per_unit, currency),
            "per_unit_micro_minor": self.per_unit,
            "effective_from": from_us(self.effective_from_us).isoformat(),
            "model": self.model,
        }
        if self.tiers:
            found["tiers"] = [
                {"up_to": up_to, "price": format_price(price, currency)}
                for up_to, price in self.tiers
            ]
        if self.package is not None and self.per_package is not None:
            found["package"] = self.package
            found["per_package"] = format_price(self.per_package, currency)
        if self.flat_fee:
            found["flat_fee"] = format_amount(self.flat_fee, currency)
        return found


def parse_tier(text: object, currency: str) -> Tier:
    """``"1000:0.01"`` (up to 1,000 units of the window, 0.01 a unit) or
    ``"inf:0.005"`` as a `Tier`; also a pair ``(1000, "0.01")``."""
    up_text: object
    price_text: object
    if isinstance(text, str) and text.count(":") == 1:
        up_text, price_text = (part.strip() for part in text.split(":"))
    elif isinstance(text, tuple | list) and len(text) == 2:
        up_text, price_text = text
    else:
        raise InvalidInput("tiers", f"{shown(text)} is not a tier like 1000:0.01 or inf:0.005")
    price = _scaled("tiers", price_text, minor_digits(currency) + PRICE_EXTRA_DIGITS, MAX_PRICE)
    if up_text is None or (isinstance(up_text, str) and up_text.lower() == "inf"):
        return (None, price)
    up_to = int(up_text) if isinstance(up_text, str) and up_text.isdigit() else up_text
    if isinstance(up_to, bool) or not isinstance(up_to, int) or up_to <= 0:
        raise InvalidInput("tiers", f"a tier's end {shown(up_text)} is not a whole number > 0")
    return (up_to, price)


def validate_tiers(tiers: Sequence[Tier]) -> tuple[Tier, ...]:
    """Tiers with increasing ends, the last without one (``inf``)."""
    if not tiers:
        raise InvalidInput("tiers", "give at least one tier, the last up to inf")
    if len(tiers) > MAX_TIERS:
        raise InvalidInput("tiers", f"at most {MAX_TIERS} tiers")
    ends = [up_to for up_to, _ in tiers]
    if ends[-1] is not None:
        raise InvalidInput("tiers", "the last tier must be up to inf")
    if None in ends[:-1]:
        raise InvalidInput("tiers", "only the last tier may be up to inf")
    finite = [end for end in ends[:-1] if end is not None]
    if any(b <= a for a, b in pairwise(finite)):
        raise InvalidInput("tiers", "tiers must be sorted by their end, each above the last")
    if finite and finite[-1] > MAX_AMOUNT:
        raise InvalidInput("tiers", f"a tier's end {finite[-1]:,} is too large")
    return tuple(tiers)


def validate_model(
    model: str,
    per_unit: int | None,
    tiers: Sequence[Tier],
    package: object,
    per_package: int | None,
) -> None:
    """The fields ``model`` needs, and none it does not."""
    if model not in MODELS:
        raise InvalidInput("model", f"{shown(model)} is not one of {', '.join(MODELS)}")
    if model == "per_unit" and per_unit is None:
        raise InvalidInput("per_unit", "is required with the per_unit model")
    if model != "per_unit" and per_unit is not None:
        raise InvalidInput("per_unit", f"is not used with the {model} model")
    if model in ("graduated", "volume"):
        validate_tiers(tiers)
    elif tiers:
        raise InvalidInput("tiers", f"are not used with the {model} model")
    if model == "package":
        if isinstance(package, bool) or not isinstance(package, int) or package <= 0:
            raise InvalidInput("package", f"{shown(package)}: give the units of a package, > 0")
        if package > MAX_AMOUNT:
            raise InvalidInput("package", f"{package:,} is too large")
        if per_package is None:
            raise InvalidInput("per_package", "is required with the package model")
    elif package is not None or per_package is not None:
        raise InvalidInput("package", f"is not used with the {model} model")


def window_price(price: Price, total: int) -> int:
    """The price of a window's ``total`` units, micro-minor units, flat fee
    excluded; never less than that of a smaller total (``volume`` keeps the
    highest price its total has reached: crossing into a cheaper tier costs
    nothing until the total's price passes it)."""
    if total <= 0:
        return 0
    model = price.model
    if model == "package":
        assert price.package is not None and price.per_package is not None
        return -(-total // price.package) * price.per_package
    if model == "per_unit":
        assert price.per_unit is not None
        return total * price.per_unit
    tiers = price.tiers
    if model == "graduated":
        found, start = 0, 0
        for up_to, each in tiers:
            end = total if up_to is None else min(total, up_to)
            if end > start:
                found += (end - start) * each
            if up_to is None or total <= up_to:
                break
            start = up_to
        return found
    # volume: the highest of n times its tier's price over n up to the total
    best = 0
    for up_to, each in tiers:
        if up_to is None or total <= up_to:
            return max(best, total * each)
        best = max(best, up_to * each)
    return best  # pragma: no cover - the last tier has no end


def tiered_amount(price: Price, before: int, cost: int) -> int:
    """What ``cost`` more units cost in a window that held ``before``: the
    rounded price of the total after less that before (never negative), plus
    the flat fee when the charge starts the window (``before`` 0).
    A ``per_unit`` price rounds the charge on its own (`charge_amount`)."""
    if cost <= 0:
        return 0
    if price.model == "per_unit":
        assert price.per_unit is not None
        amount = charge_amount(cost, price.per_unit)
    else:
        after = round_micro(window_price(price, before + cost))
        amount = after - round_micro(window_price(price, before))
    return amount + (price.flat_fee if before <= 0 else 0)


def counted_amounts(price: Price, before: int, costs: Sequence[int]) -> list[int]:
    """The `tiered_amount` of each charge of ``costs``, one after the other,
    in a window that held ``before`` (at least 0). A tiered price's window
    is priced once per charge: the price after one is the price before the
    next."""
    assert before >= 0
    if price.model == "per_unit":
        assert price.per_unit is not None
        each, fee = price.per_unit, price.flat_fee
        found = []
        for cost in costs:
            if cost <= 0:
                found.append(0)
                continue
            found.append(charge_amount(cost, each) + (fee if before <= 0 else 0))
            before += cost
        return found
    if price.model == "graduated":
        rate = _one_tier(price.tiers, before, sum(cost for cost in costs if cost > 0))
        if rate is not None:  # every charge in one tier: priced linearly from before's price
            return _linear(price, before, costs, rate)
    found, was = [], round_micro(window_price(price, before))
    for cost in costs:
        if cost <= 0:
            found.append(0)
            continue
        now = round_micro(window_price(price, before + cost))
        found.append(now - was + (price.flat_fee if before <= 0 else 0))
        before, was = before + cost, now
    return found


def _one_tier(tiers: Sequence[Tier], before: int, added: int) -> int | None:
    """The price a unit of the graduated tier holding every total from
    ``before`` to ``before + added``, or None when they span two tiers."""
    for up_to, each in tiers:
        if up_to is None or before < up_to:
            return each if up_to is None or before + added <= up_to else None
    return None  # pragma: no cover - the last tier has no end


def _linear(price: Price, before: int, costs: Sequence[int], each: int) -> list[int]:
    """`counted_amounts` of a graduated price whose charges all fall in the
    tier of ``each`` a unit: the window's price grows by ``each`` a unit."""
    micro = window_price(price, before)
    fee = price.flat_fee if before <= 0 else 0
    if not (micro % PRICE_SCALE or each % PRICE_SCALE):  # whole minor units: no rounding
        unit, found = each // PRICE_SCALE, []
        for cost in costs:
            if cost <= 0:
                found.append(0)
            else:
                found.append(cost * unit + fee)
                fee = 0
        return found
    found, was = [], round_micro(micro)
    for cost in costs:
        if cost <= 0:
            found.append(0)
            continue
        micro += cost * each
        now = round_micro(micro)
        found.append(now - was + fee)
        was, fee = now, 0
    return found


def _ceiling(price: Price, cost: int) -> int:
    """The most a charge of ``cost`` units may cost at ``price``, whatever its window held."""
    if price.model == "per_unit":
        assert price.per_unit is not None
        top = cost * price.per_unit
    elif price.model == "package":
        assert price.package is not None and price.per_package is not None
        top = (-(-cost // price.package) + 1) * price.per_package
    else:
        highest = max(each for _, each in price.tiers)
        top = cost * highest
        if price.model == "volume":  # a jump at a tier's end, at most its end at the highest
            top += max((up_to or 0) for up_to, _ in price.tiers) * highest
    return round_micro(top) + 1 + price.flat_fee


# A limit's prices, sorted by effective_from_us.
PriceHistory = Sequence[Price]


_effective_from: Final = attrgetter("effective_from_us")


def price_at(history: PriceHistory, at_us: int) -> Price | None:
    """The price in force at ``at_us``: the last one effective by then, if it prices."""
    index = bisect_right(history, at_us, key=_effective_from)
    if index == 0:
        return None
    found = history[index - 1]
    return found if found.prices else None


def prices_from(history: Iterable[Price], at_us: int) -> list[Price]:
    """The prices of ``history`` (one limit's, oldest first) that price at
    ``at_us`` or later: per currency, the one in force then and those after."""
    found: dict[str, list[Price]] = {}
    for price in history:
        kept = found.setdefault(price.currency, [])
        if price.effective_from_us <= at_us:
            kept.clear()
        kept.append(price)
    return [price for kept in found.values() for price in kept if price.prices]


@dataclass(frozen=True, slots=True)
class PricedCharge:
    """What one charge costs: its position in the event, currency and amount
    (minor units); ``counted``: the amount depends on its window's total."""

    index: int
    subject: str
    currency: str
    amount: int
    counted: bool = False


def bounded_amount(cost: int, price: Price, before: int = 0) -> int:
    """`tiered_amount` of ``cost`` units at ``price`` in a window that held
    ``before``, when at most `MAX_AMOUNT` whatever the window held (so an
    event's sums fit a BIGINT), else `InvalidInput` naming the cost."""
    if price.counted:
        too_much = _ceiling(price, cost) > MAX_AMOUNT
    else:
        assert price.per_unit is not None
        too_much = charge_amount(cost, price.per_unit) > MAX_AMOUNT
    if too_much:
        currency = price.currency
        rate = (
            f"at {format_price(price.per_unit, currency)} {currency} a unit cost"
            if not price.counted and price.per_unit is not None
            else f"at its {price.model} price may cost"
        )
        raise InvalidInput(
            "cost",
            f"{cost:,} units of {price.limit!r} {rate} more than "
            f"{format_amount(MAX_AMOUNT, currency)} {currency}, the most one charge may cost",
        )
    return tiered_amount(price, before, cost)


def priced_charges(
    charges: Iterable[tuple[str, str, int]],
    prices: Mapping[str, PriceHistory],
    at_us: int,
    used: Sequence[int] | None = None,
) -> list[PricedCharge]:
    """The event's charges (subject, limit, cost) that have a price at ``at_us``,
    each rounded on its own; `InvalidInput` when one may cost more than
    `MAX_AMOUNT` (checked without ``used``, as the event is read). ``used``:
    per charge, what its counter held before the event (None: nothing), read
    at decision time for a `Price.counted` price; a counter charged twice by
    the event counts its first charge for the second."""
    found: list[PricedCharge] = []
    earlier: dict[tuple[str, str], int] = {}
    for index, (subject, limit, cost) in enumerate(charges):
        price = price_at(prices.get(limit, ()), at_us)
        if price is None:
            continue
        before = 0
        if price.counted:
            key = (subject, limit)
            before = (used[index] if used is not None else 0) + earlier.get(key, 0)
            earlier[key] = earlier.get(key, 0) + cost
        # With ``used``, at decision time: the bound was checked with the event.
        if used is None:
            amount = bounded_amount(cost, price, before)
        else:
            amount = tiered_amount(price, before, cost)
        found.append(PricedCharge(index, subject, price.currency, amount, price.counted))
    return found


def spend_charges(
    priced: Iterable[PricedCharge], spend_limits: Mapping[str, Sequence[str]]
) -> list[tuple[str, str, int]]:
    """The charges (subject, spend limit, amount) an event adds: per subject and
    spend limit of the charge's currency, the sum of its rounded amounts.
    Zero sums add nothing, but one of a `PricedCharge.counted` charge (known
    at decision time only: the event's charges are set before)."""
    totals: dict[tuple[str, str], int] = {}
    kept: set[tuple[str, str]] = set()
    for charge in priced:
        for limit in spend_limits.get(charge.currency, ()):
            key = (charge.subject, limit)
            totals[key] = totals.get(key, 0) + charge.amount
            if charge.counted:
                kept.add(key)
    return [
        (subject, limit, amount)
        for (subject, limit), amount in totals.items()
        if amount or (subject, limit) in kept
    ]


__all__ = [
    "CURRENCIES",
    "MAX_AMOUNT",
    "MODELS",
    "PRICE_EXTRA_DIGITS",
    "Price",
    "PricedCharge",
    "bounded_amount",
    "charge_amount",
    "counted_amounts",
    "format_amount",
    "format_price",
    "parse_amount",
    "parse_price",
    "parse_tier",
    "price_at",
    "priced_charges",
    "spend_charges",
    "tiered_amount",
    "validate_currency",
    "validate_model",
    "window_price",
]
