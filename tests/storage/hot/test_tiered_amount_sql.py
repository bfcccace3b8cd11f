"""The one-trip function's price of a charge by its window's total
(``metering_tiered_amount``, migration 0036) is `money.tiered_amount`'s, for
every model, across tiers' ends, with and without a flat fee, rounding half
to even."""

from __future__ import annotations

import json

import psycopg

from metering.domain.money import Price, Tier, parse_price, tiered_amount
from metering.engine.one_trip import _price_of


def _usd(text: str) -> int:
    return parse_price(text, "USD")


def _price(model: str, tiers: tuple[Tier, ...] = (), **kwargs: object) -> Price:
    return Price("calls", "USD", None, 0, model=model, tiers=tiers, **kwargs)  # type: ignore[arg-type]


PRICES = [
    _price("graduated", ((3, _usd("0.015")), (10, _usd("0.005")), (None, _usd("0.0025")))),
    _price("graduated", ((1000, _usd("0.01")), (None, _usd("0.005"))), flat_fee=100),
    _price("volume", ((4, _usd("0.02")), (10, _usd("0.01")), (None, _usd("0.003")))),
    _price("package", package=3, per_package=_usd("0.035"), flat_fee=7),
    Price("calls", "USD", _usd("0.005"), 0, flat_fee=50),  # per unit with a fee: counted
]
USED = [0, 1, 2, 3, 4, 5, 9, 10, 11, 99, 999, 1000, 1001]
COSTS = [0, 1, 2, 3, 7, 10, 1000]


def test_the_function_prices_a_charge_as_money_tiered_amount(pg_url: str) -> None:
    cases = [(price, used, cost) for price in PRICES for used in USED for cost in COSTS]
    with psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql")) as connection:
        rows = connection.execute(
            "SELECT metering_tiered_amount(p::jsonb, u, c)"
            " FROM unnest(%s::text[], %s::numeric[], %s::numeric[]) WITH ORDINALITY"
            " AS x(p, u, c, n) ORDER BY n",
            (
                [json.dumps(_price_of(price)) for price, _, _ in cases],
                [used for _, used, _ in cases],
                [cost for _, _, cost in cases],
            ),
        ).fetchall()
    found = [int(row[0]) for row in rows]
    assert found == [tiered_amount(price, used, cost) for price, used, cost in cases]
