"""Limit administration (`metering/limits/service.py`) on SQLite: limits stored all or
none, the product's own names kept apart, a priced limit never made a
gauge, and what is missing named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metering import Limit, Meter
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit
from metering.limits.service import (
    delete_limit,
    get_limit,
    list_limits,
    load_limits,
    set_limits,
    set_product_limit,
)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url) as meter:
        yield meter


def test_limits_are_stored_read_and_deleted(meter: Meter) -> None:
    calls, api = Limit("calls", maximum=5, period="1h"), Limit("api", maximum=9, period="1d")
    assert set_limits(meter.database, [calls, api]) == [calls, api]
    assert get_limit(meter.database, "calls") == calls
    assert list_limits(meter.database) == [api, calls]
    delete_limit(meter.database, "calls")
    assert list_limits(meter.database) == [api]
    with pytest.raises(UnknownLimit):
        get_limit(meter.database, "calls")
    with pytest.raises(UnknownLimit):
        delete_limit(meter.database, "calls")


def test_limits_are_stored_all_or_none(meter: Meter) -> None:
    with pytest.raises(InvalidInput, match="expected a Limit, got dict"):
        set_limits(meter.database, [Limit("calls", maximum=5, period="1h"), {"name": "x"}])  # type: ignore[list-item]
    with pytest.raises(ReservedLimit):
        set_limits(
            meter.database,
            [Limit("calls", maximum=5, period="1h"), Limit("metering.x", maximum=1, period="1s")],
        )
    assert list_limits(meter.database) == []


def test_the_products_own_limits_are_set_only_as_such(meter: Meter) -> None:
    own = Limit("metering.api.requests", maximum=100, period="1m")
    with pytest.raises(ReservedLimit):
        delete_limit(meter.database, own.name)
    assert set_product_limit(meter.database, own) == own
    assert get_limit(meter.database, own.name) == own
    with pytest.raises(ReservedLimit):
        set_product_limit(meter.database, Limit("calls", maximum=5, period="1h"))
    with pytest.raises(ReservedLimit):
        delete_limit(meter.database, own.name)


def test_a_limit_with_a_price_in_force_does_not_become_a_gauge(meter: Meter) -> None:
    set_limits(meter.database, [Limit("disk", maximum=50, period="1d")])
    meter.set_price("disk", "0.01", "USD")
    gauge = Limit("disk", maximum=50, period="1d", aggregation="max")
    with pytest.raises(InvalidInput, match="has a price") as raised:
        set_limits(meter.database, [gauge])
    assert raised.value.field == "aggregation"
    meter.remove_price("disk", "USD")
    assert set_limits(meter.database, [gauge]) == [gauge]


def test_a_file_of_limits_is_stored(meter: Meter, tmp_path: Path) -> None:
    path = tmp_path / "limits.toml"
    path.write_text('[[limits]]\nname = "calls"\nmaximum = 5\nperiod = "1h"\n')
    assert load_limits(meter.database, path) == [Limit("calls", maximum=5, period="1h")]
    assert list_limits(meter.database) == [Limit("calls", maximum=5, period="1h")]
