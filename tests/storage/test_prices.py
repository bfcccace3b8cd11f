"""`PriceStore` on SQLite and PostgreSQL: prices by limit in time order, one per
instant, each change bumping the limits' version; spend limits by currency."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from metering import Meter
from metering.domain.limits import Limit, spend_limit
from metering.domain.money import Price
from metering.storage.limits import LimitStore
from metering.storage.prices import PriceStore

T = TypeVar("T")
NOW_US = 1_800_000_000_000_000


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _on(meter: Meter, work: Callable[[PriceStore], T]) -> T:
    return meter.database.run(lambda connection: work(PriceStore(connection)))


def test_prices_come_by_limit_then_time(meter: Meter) -> None:
    later = Price("calls", "USD", 2_000, NOW_US + 10, NOW_US)
    first = Price("calls", "USD", 1_000, NOW_US, NOW_US)
    other = Price("api", "EUR", None, NOW_US, NOW_US)
    for price in (later, first, other):
        _on(meter, lambda store, price=price: store.set_price(price))
    assert _on(meter, lambda store: store.prices()) == [other, first, later]
    assert _on(meter, lambda store: store.prices("calls")) == [first, later]
    assert _on(meter, lambda store: store.prices("missing")) == []


def test_a_price_at_the_same_instant_replaces_the_one_there(meter: Meter) -> None:
    _on(meter, lambda store: store.set_price(Price("calls", "USD", 1_000, NOW_US, NOW_US)))
    replaced = Price("calls", "EUR", 3_000, NOW_US, NOW_US + 5)
    _on(meter, lambda store: store.set_price(replaced))
    assert _on(meter, lambda store: store.prices("calls")) == [replaced]


def test_histories_are_each_limits_prices_in_time_order(meter: Meter) -> None:
    prices = [
        Price("calls", "USD", 1_000, NOW_US + 5, NOW_US),
        Price("calls", "USD", 500, NOW_US, NOW_US),
        Price("api", "USD", 7, NOW_US, NOW_US),
    ]
    for price in prices:
        _on(meter, lambda store, price=price: store.set_price(price))
    assert _on(meter, lambda store: store.histories()) == {
        "api": (prices[2],),
        "calls": (prices[1], prices[0]),
    }
    assert _on(meter, lambda store: store.histories(["calls", "missing"])) == {
        "calls": (prices[1], prices[0])
    }
    assert _on(meter, lambda store: store.histories([])) == {}


def test_a_price_change_bumps_the_limits_version(meter: Meter) -> None:
    def version() -> int:
        return meter.database.run(lambda connection: LimitStore(connection).limits_version())

    before = version()
    _on(meter, lambda store: store.set_price(Price("calls", "USD", 1, NOW_US, NOW_US)))
    assert version() == before + 1


def test_spend_limits_are_named_by_currency(meter: Meter) -> None:
    for limit in (
        spend_limit("usd-b", "5", "USD", "1mo"),
        spend_limit("eur", "5", "EUR", "1mo"),
        spend_limit("usd-a", "5", "USD", "1mo"),
        Limit("calls", maximum=5, period="1h"),
    ):
        meter.database.run(
            lambda connection, limit=limit: LimitStore(connection).upsert_limit(limit, NOW_US)
        )
    assert _on(meter, lambda store: store.spend_limits()) == {
        "EUR": ["eur"],
        "USD": ["usd-a", "usd-b"],
    }


def test_no_spend_without_priced_usage(meter: Meter) -> None:
    assert _on(meter, lambda store: store.spend_amounts(None, None)) == []
