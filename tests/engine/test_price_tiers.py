"""Tiered prices and flat fees decided on both databases, by the fast path and
by the reference engine: each charge priced by its window's total before it
(in a batch too), a hard spend cap stopping at the right unit, a void giving
back what was charged, and the spend report summing the charges."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.errors import InvalidInput
from metering.reports.spend import spend_report

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PATHS = {"fast": ("direct", "connection", "reference"), "reference": ("reference",)}


@pytest.fixture(params=sorted(PATHS))
def meter(db_url: str, request: pytest.FixtureRequest) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=10**9, period="1mo", window="calendar"))
        m.set_limit(spend_limit("spend", "0.10", "USD", "1mo", window="calendar"))
        engine = m._engine
        engine.paths = [engine.path(name) for name in PATHS[request.param]]
        if request.param == "reference" and engine.direct is not None:
            engine.direct.close()
            engine.direct = None
        yield m


def _spent(meter: Meter, subject: str = "org") -> int:
    return next(c.used for c in meter.counters(subject) if c.limit == "spend")


def _amounts(meter: Meter, costs: list[int], subject: str = "org") -> list[object]:
    """The price of each consumed charge, or "denied"."""
    found: list[object] = []
    for cost in costs:
        decision = meter.consume(subject, "calls", cost)
        found.append(decision.charges[0].price[1] if decision.allowed else "denied")  # type: ignore[index]
    return found


def test_a_hard_cap_stops_a_graduated_price_at_the_right_unit(meter: Meter) -> None:
    meter.set_price("calls", None, "USD", model="graduated", tiers=["5:0.01", "inf:0.02"])
    # 1 cent for the first 5 units, then 2: 5 + 2 + 2 = 9 cents; an 8th unit would be 11.
    assert _amounts(meter, [1] * 8) == [1, 1, 1, 1, 1, 2, 2, "denied"]
    assert _spent(meter) == 9
    assert next(c.used for c in meter.counters("org") if c.limit == "calls") == 7
    # A batch: each event priced by the totals the ones before it left.
    events = [make_event([("org-b", "calls", 1)], NOW, f"b-{n}") for n in range(8)]
    decisions = meter.apply(events)
    assert [d.allowed for d in decisions] == [True] * 7 + [False]
    assert [d.charges[-1].used for d in decisions[:7]] == [1, 2, 3, 4, 5, 7, 9]
    assert _spent(meter, "org-b") == 9


def test_a_flat_fee_comes_with_the_window_s_first_charge_and_a_void_gives_it_back(
    meter: Meter,
) -> None:
    meter.set_price("calls", None, "USD", model="package", package=10, per_package="0.02")
    meter.set_price("calls", "0.001", "USD", NOW, flat_fee="0.05")
    first = meter.consume("org", "calls", 10, event_id="e-1")
    assert first.charges[0].price == ("USD", 5 + 1)  # the fee and 10 tenths of a cent
    assert _amounts(meter, [20]) == [2]
    assert _spent(meter) == 8
    meter.void("e-1", "refund")
    assert _spent(meter) == 2  # exactly what e-1 was charged, fee and all
    [row] = spend_report(meter, "2026-11").rows
    assert row.total == 2


def test_volume_never_charges_less_than_nothing(meter: Meter) -> None:
    meter.set_price(
        "calls", None, "USD", model="volume", tiers=["4:0.02", "inf:0.01"], flat_fee="0"
    )
    # 4 units cost 8 cents; 5 at 1 cent each cost 5: the window keeps 8 until 9 units.
    assert _amounts(meter, [4, 1, 3, 1]) == [8, 0, 0, 1]
    decision = meter.consume("org", "calls", 1)  # 10 units: 10 cents
    assert decision.charges[-1].used == 10 and decision.charges[0].price == ("USD", 1)
    assert [r.total for r in spend_report(meter, "2026-11").rows] == [10]
    assert not meter.consume("org", "calls", 1).allowed  # 11 cents past the cap


def test_check_prices_by_the_window_s_total(meter: Meter) -> None:
    meter.set_price("calls", None, "USD", model="graduated", tiers=["5:0.01", "inf:0.02"])
    meter.consume("org", "calls", 5)
    checked = meter.check("org", "calls", 2)
    assert checked.allowed and checked.charges[0].price == ("USD", 4)
    assert not meter.check("org", "calls", 3).allowed  # 5 + 6 cents


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"model": "graduated", "tiers": ["1000:0.01", "500:0.02", "inf:0.01"]}, "tiers"),
        ({"model": "volume", "tiers": ["1000:0.01", "2000:0.005"]}, "tiers"),
        ({"model": "graduated", "tiers": ["1000:-0.01", "inf:0.005"]}, "tiers"),
        ({"model": "package", "package": 0, "per_package": "1.00"}, "package"),
        ({"model": "graduated"}, "tiers"),
        ({"model": "tiered", "tiers": ["inf:1"]}, "model"),
        ({"model": "package", "package": 10, "per_package": "1", "flat_fee": "-1"}, "flat_fee"),
    ],
)
def test_a_bad_tiered_price_is_refused_and_nothing_is_stored(
    meter: Meter, options: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        meter.set_price("calls", None, "USD", **options)  # type: ignore[arg-type]
    assert refused.value.field == field
    assert meter.prices() == []


def test_tiers_price_a_fixed_window_only(meter: Meter) -> None:
    meter.set_limit(Limit("api", maximum=10, period="60s", algorithm="token_bucket"))
    with pytest.raises(InvalidInput, match="a fixed window's total"):
        meter.set_price("api", None, "USD", model="graduated", tiers=["inf:0.01"])
    with pytest.raises(InvalidInput, match="a fixed window's total"):
        meter.set_price("api", "0.01", "USD", flat_fee="1")
    assert meter.prices() == []


def test_a_reservation_is_charged_by_the_window_s_total_and_cancel_gives_it_back(
    meter: Meter,
) -> None:
    meter.set_price("calls", None, "USD", model="graduated", tiers=["5:0.01", "inf:0.02"])
    meter.consume("org", "calls", 4)
    held = meter.reserve("org", "calls", 2)  # one unit at 0.01, one at 0.02
    assert _spent(meter) == 4 + 3
    held.cancel()
    assert _spent(meter) == 4
    assert _amounts(meter, [2]) == [3]
