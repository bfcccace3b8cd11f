"""The one-trip function's price of a charge by its window's total
(``metering_tiered_amount``, migration 0036) is `money.tiered_amount`'s, for
every model, across tiers' ends, with and without a flat fee, rounding half
to even; also for prices, totals and costs Hypothesis draws, up to the
largest allowed."""

from __future__ import annotations

import json

import psycopg
import pytest
from budgets import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metering.domain.money import (
    MAX_AMOUNT,
    MAX_PRICE,
    MODELS,
    Price,
    Tier,
    parse_price,
    tiered_amount,
)
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


Case = tuple[Price, int, int]


def _server_amounts(connection: psycopg.Connection, cases: list[Case]) -> list[int]:
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
    return [int(row[0]) for row in rows]


def _connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True)


def test_the_function_prices_a_charge_as_money_tiered_amount(pg_url: str) -> None:
    cases = [(price, used, cost) for price in PRICES for used in USED for cost in COSTS]
    with _connect(pg_url) as connection:
        found = _server_amounts(connection, cases)
    assert found == [tiered_amount(price, used, cost) for price, used, cost in cases]


# Small figures cross tiers' ends and halves of a minor unit; large ones test exactness.
_units = st.one_of(st.integers(0, 40), st.integers(0, MAX_AMOUNT))
_micro = st.one_of(
    st.integers(0, 3_000_000),
    st.sampled_from([0, 500_000, 1_500_000, 2_500_000, 250_000]),
    st.integers(0, MAX_PRICE),
)


@st.composite
def _prices(draw: st.DrawFn) -> Price:
    model = draw(st.sampled_from(MODELS))
    fee = draw(st.one_of(st.just(0), st.integers(0, 10**6)))
    if model == "per_unit":
        return Price("calls", "USD", draw(_micro), 0, flat_fee=fee)
    if model == "package":
        package = draw(st.one_of(st.integers(1, 12), st.integers(1, MAX_AMOUNT)))
        return _price(model, package=package, per_package=draw(_micro), flat_fee=fee)
    ends = draw(
        st.lists(
            st.one_of(st.integers(1, 30), st.integers(1, MAX_AMOUNT)),
            max_size=6,
            unique=True,
        )
    )
    tiers = (*((end, draw(_micro)) for end in sorted(ends)), (None, draw(_micro)))
    return _price(model, tiers, flat_fee=fee)


@pytest.mark.postgres
@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(cases=st.lists(st.tuples(_prices(), _units, _units), min_size=1, max_size=30))
def test_drawn_prices_are_priced_as_money_tiered_amount(pg_url: str, cases: list[Case]) -> None:
    with _connect(pg_url) as connection:
        found = _server_amounts(connection, cases)
    assert found == [tiered_amount(price, used, cost) for price, used, cost in cases]
