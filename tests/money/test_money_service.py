"""The transactions of prices (`metering/money/service.py`) on both databases:
a price set from now or a later instant, replaced at the same instant, ended
by a removal; listed by limit and time; refused, storing nothing, for what is
not priced per unit (a spend limit, seats, a concurrent limit, a gauge,
a shadow limit),
tiers on anything but a fixed window, a float, a reserved or unknown limit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.instants import to_us
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(days=1)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=1000, period="1mo", window="calendar"),
                Limit("rolling", maximum=1000, period="1h", algorithm="token_bucket"),
                Limit("seats", maximum=5, period="1mo", distinct="user"),
                Limit("cad", maximum=5, algorithm="concurrent"),
                Limit("disk", maximum=100, period="1d", aggregation="max"),
                Limit("trial", maximum=100, period="1d", enforcement="shadow"),
                spend_limit("cap", "10", "USD", "1mo", window="calendar"),
            ]
        )
        yield meter


def test_a_price_is_set_replaced_ended_and_listed(meter: Meter) -> None:
    first = meter.set_price("calls", "0.01", "USD")
    assert (first.per_unit, first.effective_from_us, first.model) == (
        1_000_000,
        to_us(NOW),
        "per_unit",
    )
    meter.set_price("calls", "0.02", "USD")  # the same instant: replaced
    meter.set_price("calls", "0.03", "USD", effective_from=LATER)
    ended = meter.remove_price("calls", "USD", effective_from=LATER + timedelta(days=1))
    assert ended.per_unit is None
    meter.set_price("rolling", "0.5", "EUR")
    listed = [(p.limit, p.currency, p.per_unit) for p in meter.prices("calls")]
    assert listed == [
        ("calls", "USD", 2_000_000),
        ("calls", "USD", 3_000_000),
        ("calls", "USD", None),
    ]
    assert [p.limit for p in meter.prices()] == ["calls", "calls", "calls", "rolling"]


def test_a_tiered_price_is_only_for_a_fixed_window(meter: Meter) -> None:
    tiered = meter.set_price(
        "calls", None, "USD", model="graduated", tiers=[(100, "0.01"), (None, "0.005")]
    )
    assert tiered.model == "graduated" and len(tiered.tiers) == 2
    with pytest.raises(InvalidInput) as raised:
        meter.set_price("rolling", None, "USD", model="graduated", tiers=[(None, "0.01")])
    assert raised.value.field == "model"


@pytest.mark.parametrize(
    ("limit", "per_unit", "currency", "field"),
    [
        ("cap", "1", "USD", "limit"),
        ("seats", "1", "USD", "limit"),
        ("cad", "1", "USD", "limit"),
        ("disk", "1", "USD", "limit"),
        ("trial", "1", "USD", "limit"),
        ("calls", 0.01, "USD", "per_unit"),
        ("calls", None, "USD", "per_unit"),
        ("calls", "0.01", "XXX", "currency"),
    ],
)
def test_what_is_not_priced_per_unit_is_refused_and_stores_nothing(
    meter: Meter, limit: str, per_unit: object, currency: str, field: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        meter.set_price(limit, per_unit, currency)
    assert raised.value.field == field
    assert meter.prices() == []


def test_an_unknown_or_reserved_limit_is_refused(meter: Meter) -> None:
    with pytest.raises(UnknownLimit):
        meter.set_price("nope", "1", "USD")
    with pytest.raises(ReservedLimit):
        meter.set_price("metering.api_requests", "1", "USD")
    with pytest.raises(InvalidInput):
        meter.prices("Not A Name")
    assert meter.prices() == []
