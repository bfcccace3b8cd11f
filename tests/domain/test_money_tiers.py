"""Tiered prices and flat fees (`metering.domain.money`): each model's price of a
window's total, the amount of a charge (the rounded difference of the totals'
prices), and a property holding every model to the same sums in `Decimal`."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.domain.money import (
    MAX_AMOUNT,
    MAX_TIERS,
    Price,
    Tier,
    bounded_amount,
    counted_amounts,
    parse_price,
    parse_tier,
    price_at,
    priced_charges,
    prices_from,
    spend_charges,
    tiered_amount,
    validate_model,
    validate_tiers,
    window_price,
)
from metering.errors import InvalidInput


def _usd(text: str) -> int:
    return parse_price(text, "USD")


def _price(model: str, tiers: tuple[Tier, ...] = (), **kwargs: object) -> Price:
    return Price("calls", "USD", None, 0, model=model, tiers=tiers, **kwargs)  # type: ignore[arg-type]


GRADUATED = _price("graduated", ((1000, _usd("0.01")), (None, _usd("0.005"))))
VOLUME = _price("volume", ((1000, _usd("0.01")), (None, _usd("0.005"))))
PACKAGE = _price("package", package=100, per_package=_usd("1.00"))


def _charges(price: Price, costs: list[int]) -> list[int]:
    """The amounts of charges of ``costs`` one after the other in one window."""
    found, total = [], 0
    for cost in costs:
        found.append(tiered_amount(price, total, cost))
        total += cost
    return found


def test_graduated_prices_each_unit_at_its_tier() -> None:
    assert window_price(GRADUATED, 1500) == 1000 * _usd("0.01") + 500 * _usd("0.005")
    # 10.00 USD for the first 1,000, then half a cent each.
    assert _charges(GRADUATED, [600, 600, 1000]) == [600, 400 + 100, 500]


def test_volume_prices_every_unit_at_the_tier_the_total_reaches() -> None:
    assert window_price(VOLUME, 999) == 999 * _usd("0.01")
    # 1,000 units cost 10.00; 1,001 would cost 5.005: the window keeps 10.00 until
    # its total's price passes it (at 2,000 units), and no charge is negative.
    assert window_price(VOLUME, 1001) == 1000 * _usd("0.01")
    assert _charges(VOLUME, [1000, 1, 998, 1, 2]) == [1000, 0, 0, 0, 1]
    assert _charges(VOLUME, [3000]) == [1500]


def test_a_volume_total_at_a_tiers_end_is_priced_in_that_tier() -> None:
    dearer = _price("volume", ((10, 5), (None, 7)))  # a dearer tier past the first ten
    assert [window_price(dearer, total) for total in (9, 10, 11)] == [45, 50, 77]


def test_package_prices_each_block_begun() -> None:
    assert _charges(PACKAGE, [1, 99, 1, 250]) == [100, 0, 100, 200]


def test_the_flat_fee_is_charged_with_the_charge_that_starts_the_window() -> None:
    fee = _price("package", package=100, per_package=_usd("1.00"), flat_fee=2000)
    assert _charges(fee, [1, 1]) == [2100, 0]
    per_unit = Price("calls", "USD", _usd("0.01"), 0, flat_fee=2000)
    assert per_unit.counted and not Price("calls", "USD", 1, 0).counted
    assert _charges(per_unit, [10, 10]) == [2010, 10]
    assert tiered_amount(per_unit, 0, 0) == 0  # nothing charged: no fee


def test_a_counted_price_reads_the_counters_and_keeps_its_spend_charge_at_zero() -> None:
    prices = {"calls": (VOLUME,)}
    charges = [("org", "calls", 1), ("org", "calls", 1)]
    # The counter held 999: the first charge reaches 1,000 (1 cent), the second
    # crosses into the cheaper tier (nothing more).
    found = priced_charges(charges, prices, 0, used=[999, 999])
    assert [(c.amount, c.counted) for c in found] == [(1, True), (0, True)]
    assert spend_charges(found, {"USD": ["spend"]}) == [("org", "spend", 1)]
    crossing = priced_charges(charges[:1], prices, 0, used=[1000])
    assert spend_charges(crossing, {"USD": ["spend"]}) == [("org", "spend", 0)]
    removed = Price("calls", "USD", None, 5)
    assert price_at((VOLUME, removed), 4) == VOLUME and price_at((VOLUME, removed), 5) is None


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        (((1000, 1), (500, 1), (None, 1)), "sorted"),
        (((1000, 1), (1000, 1), (None, 1)), "sorted"),
        (((1000, 1),), "the last tier must be up to inf"),
        (((None, 1), (None, 1)), "only the last"),
        ((), "at least one"),
    ],
)
def test_bad_tiers_are_refused(tiers: tuple[Tier, ...], message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as refused:
        validate_tiers(tiers)
    assert refused.value.field == "tiers"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1000:-0.01", "not an amount"),
        ("0:0.01", "whole number > 0"),
        ("ten:0.01", "whole number > 0"),
        ("1000", "not a tier"),
        ("1000:0.000000001", "more than 8 decimals"),
    ],
)
def test_bad_tier_text_is_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_tier(text, "USD")


def test_a_tier_reads_from_text_or_a_pair() -> None:
    assert parse_tier("1000:0.01", "USD") == (1000, 1_000_000)
    assert parse_tier(" INF : 0.005 ", "usd") == (None, 500_000)
    assert parse_tier((None, "1"), "JPY") == (None, 1_000_000)


@pytest.mark.parametrize(
    ("model", "per_unit", "tiers", "package", "per_package", "field"),
    [
        ("stepped", None, (), None, None, "model"),
        ("per_unit", None, (), None, None, "per_unit"),
        ("graduated", 5, ((None, 1),), None, None, "per_unit"),
        ("package", None, (), 0, 100, "package"),
        ("package", None, (), None, 100, "package"),
        ("package", None, (), 10, None, "per_package"),
        ("package", None, ((None, 1),), 10, 100, "tiers"),
        ("volume", None, (), None, None, "tiers"),
        ("volume", None, ((None, 1),), 10, None, "package"),
    ],
)
def test_a_model_wants_its_fields_and_no_other(
    model: str,
    per_unit: int | None,
    tiers: tuple[Tier, ...],
    package: int | None,
    per_package: int | None,
    field: str,
) -> None:
    with pytest.raises(InvalidInput) as refused:
        validate_model(model, per_unit, tiers, package, per_package)
    assert refused.value.field == field


# -- the property: every model against Decimal -----------------------------------------

CENT = Decimal("0.01")
prices_text = st.integers(0, 10**6).map(lambda n: Decimal(n).scaleb(-6))  # up to 1 USD, 8 dp


@st.composite
def tiered_prices(draw: st.DrawFn) -> tuple[Price, dict[str, object]]:
    """A USD price of any model, and the same in `Decimal` (major units)."""
    model = draw(st.sampled_from(["graduated", "volume", "package", "per_unit"]))
    flat = draw(st.sampled_from([Decimal(0), Decimal(0), Decimal("20"), Decimal("0.05")]))
    spec: dict[str, object] = {"model": model, "flat": flat}
    kwargs: dict[str, object] = {"flat_fee": int(flat / CENT)}
    per_unit = None
    if model in ("graduated", "volume"):
        ends = sorted(draw(st.sets(st.integers(1, 60), max_size=3)))
        rates = draw(st.lists(prices_text, min_size=len(ends) + 1, max_size=len(ends) + 1))
        spec["tiers"] = [*zip([*ends, None], rates, strict=True)]
        kwargs["tiers"] = tuple(
            (end, _usd(str(rate))) for end, rate in zip([*ends, None], rates, strict=True)
        )
    elif model == "package":
        size, each = draw(st.integers(1, 20)), draw(prices_text)
        spec["package"], spec["per_package"] = size, each
        kwargs["package"], kwargs["per_package"] = size, _usd(str(each))
    else:
        spec["per_unit"] = draw(prices_text)
        per_unit = _usd(str(spec["per_unit"]))
    return Price("calls", "USD", per_unit, 0, model=model, **kwargs), spec  # type: ignore[arg-type]


def _exact(spec: dict[str, object], total: int) -> Decimal:
    """The price of a window's ``total`` units in Decimal, flat fee excluded."""
    model = spec["model"]
    if model == "package":
        size, each = spec["package"], spec["per_package"]
        assert isinstance(size, int) and isinstance(each, Decimal)
        return -(-total // size) * each
    tiers = spec["tiers"]
    assert isinstance(tiers, list)

    def rate(n: int) -> Decimal:
        return next(r for end, r in tiers if end is None or n <= end)

    if model == "volume":  # the highest volume price of any total up to this one
        return max((n * rate(n) for n in range(total + 1)), default=Decimal(0))
    return sum((rate(n) for n in range(1, total + 1)), Decimal(0))


def _minor(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_EVEN)


@given(priced=tiered_prices(), costs=st.lists(st.integers(0, 40), min_size=1, max_size=6))
def test_every_model_charges_a_window_what_decimal_says(
    priced: tuple[Price, dict[str, object]], costs: list[int]
) -> None:
    price, spec = priced
    amounts = _charges(price, costs)
    assert all(amount >= 0 for amount in amounts)
    total = sum(costs)
    flat = spec["flat"] if total else Decimal(0)
    assert isinstance(flat, Decimal)
    if spec["model"] == "per_unit":  # each charge rounded on its own, as before tiers
        rate = spec["per_unit"]
        assert isinstance(rate, Decimal)
        expected = sum((_minor(cost * rate) for cost in costs), Decimal(0)) + flat
    else:  # the window's total priced once, rounded once
        expected = _minor(_exact(spec, total)) + flat
    assert Decimal(sum(amounts)) * CENT == expected
    assert counted_amounts(price, 0, costs) == amounts  # found at once


@given(
    priced=tiered_prices(),
    before=st.integers(0, 80),
    costs=st.lists(st.integers(0, 40), min_size=1, max_size=6),
)
def test_a_batchs_charges_cost_together_what_they_cost_one_by_one(
    priced: tuple[Price, dict[str, object]], before: int, costs: list[int]
) -> None:
    """`counted_amounts` from any usage before them: each charge's
    `tiered_amount`, from what the ones before it left."""
    price, _ = priced
    found, used = [], before
    for cost in costs:
        found.append(tiered_amount(price, used, cost))
        used += cost
    assert counted_amounts(price, before, costs) == found


whole_cents = st.integers(0, 100).map(lambda n: n * 10_000)  # 0 to 1 USD, whole cents


@given(
    ends=st.sets(st.integers(1, 60), max_size=3),
    rates=st.lists(st.one_of(whole_cents, st.integers(0, 10**6)), min_size=4, max_size=4),
    flat_fee=st.sampled_from([0, 5, 2000]),
    before=st.integers(0, 80),
    costs=st.lists(st.integers(-2, 40), min_size=1, max_size=6),
)
def test_graduated_charges_in_one_tier_cost_what_they_cost_one_by_one(
    ends: set[int], rates: list[int], flat_fee: int, before: int, costs: list[int]
) -> None:
    """A graduated price's charges that stay in one tier are priced linearly
    (whole cents a unit: no rounding at all); across tiers as any other:
    each charge its `tiered_amount` either way."""
    tiers = tuple(zip([*sorted(ends), None], rates, strict=False))
    price = _price("graduated", tiers, flat_fee=flat_fee)
    found, used = [], before
    for cost in costs:
        found.append(tiered_amount(price, used, cost))
        used += max(cost, 0)
    assert counted_amounts(price, before, costs) == found


MOST = "more than 10000000000000.00 USD, the most one charge may cost"


@pytest.mark.parametrize(
    ("price", "most", "rate"),
    [
        # 0.01 USD a unit: the amount itself is bounded
        (Price("calls", "USD", 10**6, 0), MAX_AMOUNT, "at 0.01 USD a unit cost"),
        # counted: the rounded units' price, 1 for rounding, and the fee
        (
            Price("calls", "USD", 10**6, 0, flat_fee=5),
            MAX_AMOUNT - 6,
            "at its per_unit price may cost",
        ),
        # a block more than the cost begins, at 0.01 USD a block of 10
        (
            _price("package", package=10, per_package=10**6),
            10 * (MAX_AMOUNT - 2),
            "at its package price may cost",
        ),
        # every unit at the highest tier's price (not the first tier's)
        (
            _price("graduated", ((1000, 5 * 10**5), (None, 10**6))),
            MAX_AMOUNT - 1,
            "at its graduated price may cost",
        ),
        # and a volume price's jump: the longest tier's end at the highest price
        (
            _price("volume", ((1000, 10**6), (2000, 5 * 10**5), (None, 10**5))),
            MAX_AMOUNT - 2001,
            "at its volume price may cost",
        ),
        # one tier, no end: no jump
        (_price("volume", ((None, 10**6),)), MAX_AMOUNT - 1, "at its volume price may cost"),
    ],
)
def test_a_charge_may_cost_at_most_the_most_one_charge_may_cost(
    price: Price, most: int, rate: str
) -> None:
    """`bounded_amount`: the most units a charge may have is the most whose
    dearest price (whatever its window held) is at most `MAX_AMOUNT`."""
    assert bounded_amount(most, price, 7) == tiered_amount(price, 7, most)
    with pytest.raises(InvalidInput) as raised:
        bounded_amount(most + 1, price, 7)
    assert raised.value.field == "cost"
    assert str(raised.value) == f"cost: {most + 1:,} units of 'calls' {rate} {MOST}"


# -- what each refusal says ---------------------------------------------------------

ENDS = tuple((end, 1) for end in range(1, MAX_TIERS))  # 31 tiers with an end


@pytest.mark.parametrize(
    ("args", "field", "message"),
    [
        (
            ("stepped", None, (), None, None),
            "model",
            "'stepped' is not one of per_unit, graduated, volume, package",
        ),
        (("per_unit", None, (), None, None), "per_unit", "is required with the per_unit model"),
        (
            ("graduated", 5, ((None, 1),), None, None),
            "per_unit",
            "is not used with the graduated model",
        ),
        (
            ("graduated", None, (), None, None),
            "tiers",
            "give at least one tier, the last up to inf",
        ),
        (("volume", None, (), None, None), "tiers", "give at least one tier, the last up to inf"),
        (("package", None, ((None, 1),), 10, 100), "tiers", "are not used with the package model"),
        (("package", None, (), 0, 100), "package", "0: give the units of a package, > 0"),
        (("package", None, (), None, 100), "package", "None: give the units of a package, > 0"),
        (("package", None, (), True, 100), "package", "True: give the units of a package, > 0"),
        (("package", None, (), "5", 100), "package", "'5': give the units of a package, > 0"),
        (
            ("package", None, (), MAX_AMOUNT + 1, 100),
            "package",
            "1,000,000,000,000,001 is too large",
        ),
        (("package", None, (), 10, None), "per_package", "is required with the package model"),
        (("volume", None, ((None, 1),), 10, None), "package", "is not used with the volume model"),
        (("volume", None, ((None, 1),), None, 5), "package", "is not used with the volume model"),
    ],
)
def test_a_models_refusal_names_the_field_and_says_why(
    args: tuple[str, int | None, tuple[Tier, ...], object, int | None], field: str, message: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        validate_model(*args)
    assert (refused.value.field, str(refused.value)) == (field, f"{field}: {message}")


@pytest.mark.parametrize(
    "args",
    [
        ("per_unit", 5, (), None, None),
        ("graduated", None, ((None, 1),), None, None),
        ("volume", None, ((10, 2), (None, 1)), None, None),
        ("package", None, (), 1, 100),
        ("package", None, (), MAX_AMOUNT, 100),
    ],
)
def test_a_model_with_its_fields_is_valid(
    args: tuple[str, int | None, tuple[Tier, ...], object, int | None],
) -> None:
    validate_model(*args)


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        (
            ((1000, 1), (500, 1), (None, 1)),
            "tiers must be sorted by their end, each above the last",
        ),
        (((1000, 1),), "the last tier must be up to inf"),
        (((None, 1), (None, 1)), "only the last tier may be up to inf"),
        ((), "give at least one tier, the last up to inf"),
        ((*ENDS, (32, 1), (None, 1)), "at most 32 tiers"),
        (
            ((5, 1), (6, 1), (MAX_AMOUNT + 1, 1), (None, 1)),
            "a tier's end 1,000,000,000,000,001 is too large",
        ),
    ],
)
def test_what_bad_tiers_are_told(tiers: tuple[Tier, ...], message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        validate_tiers(tiers)
    assert (refused.value.field, str(refused.value)) == ("tiers", f"tiers: {message}")


def test_tiers_up_to_the_limits_are_valid() -> None:
    assert validate_tiers((*ENDS, (None, 1))) == (*ENDS, (None, 1))  # 32 tiers
    most = ((5, 1), (MAX_AMOUNT, 1), (None, 1))
    assert validate_tiers(most) == most


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1000:-0.01", "'-0.01' is not an amount like 50 or 1.00"),
        ("0:0.01", "a tier's end '0' is not a whole number > 0"),
        ((0, "1"), "a tier's end 0 is not a whole number > 0"),
        ((True, "1"), "a tier's end True is not a whole number > 0"),
        ("ten:0.01", "a tier's end 'ten' is not a whole number > 0"),
        ("1000", "'1000' is not a tier like 1000:0.01 or inf:0.005"),
        ("ab", "'ab' is not a tier like 1000:0.01 or inf:0.005"),
        ("1:2:3", "'1:2:3' is not a tier like 1000:0.01 or inf:0.005"),
        ((1, 2, 3), "(1, 2, 3) is not a tier like 1000:0.01 or inf:0.005"),
        ("1000:0.000000001", "'0.000000001' has more than 8 decimals"),
    ],
)
def test_what_bad_tier_text_is_told(text: object, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_tier(text, "USD")
    assert (refused.value.field, str(refused.value)) == ("tiers", f"tiers: {message}")


def test_a_tier_may_end_at_one_unit() -> None:
    assert parse_tier("1:1", "USD") == (1, 100_000_000)
    assert parse_tier(["1", "0.5"], "USD") == (1, 50_000_000)


def test_a_tiered_price_as_a_dict() -> None:
    tiered = _price("graduated", ((1000, _usd("0.01")), (None, _usd("0.005"))), flat_fee=2000)
    assert tiered.to_dict() == {
        "limit": "calls",
        "currency": "USD",
        "per_unit": None,
        "per_unit_micro_minor": None,
        "effective_from": "1970-01-01T00:00:00+00:00",
        "model": "graduated",
        "tiers": [{"up_to": 1000, "price": "0.01"}, {"up_to": None, "price": "0.005"}],
        "flat_fee": "20.00",
    }
    package = Price("calls", "JPY", None, 0, model="package", package=100, per_package=1_500_000)
    assert package.to_dict() == {
        "limit": "calls",
        "currency": "JPY",
        "per_unit": None,
        "per_unit_micro_minor": None,
        "effective_from": "1970-01-01T00:00:00+00:00",
        "model": "package",
        "package": 100,
        "per_package": "1.5",
    }


# -- counted_amounts: the charges of a batch, one after the other ------------------

COUNTED = [
    # whole minor units in every tier (the linear shortcut), with a fee
    _price("graduated", ((10, 2 * 10**6), (None, 10**6)), flat_fee=300),
    # a window's price at half a cent, then a tier of whole cents: rounding half to even
    _price("graduated", ((1, 500_000), (None, 10**6))),
    _price("graduated", ((5, 1_250_000), (8, 700_000), (None, 300_000))),
    _price("graduated", ((5, 1_250_000), (None, 700_000)), flat_fee=100),
    _price("volume", ((10, 2 * 10**6), (None, 10**6)), flat_fee=50),
    _price("package", package=3, per_package=10**6),
    Price("calls", "USD", 1_500_000, 0, flat_fee=7),
]
BATCHES = [[1], [1, 1], [1, 0, 1, 1], [0, 2, 1], [3, 1, 9, 1, 1], [10], [9, 1, 1], [4, 4, 4]]


@pytest.mark.parametrize("price", COUNTED)
@pytest.mark.parametrize("before", [0, 1, 5, 9, 10, 11])
def test_a_batchs_charges_cost_what_each_would_alone(price: Price, before: int) -> None:
    """`counted_amounts` equals `tiered_amount` charge after charge (its
    shortcuts included): every amount a whole number of minor units."""
    for costs in BATCHES:
        expected, total = [], before
        for cost in costs:
            expected.append(tiered_amount(price, total, cost))
            total += max(cost, 0)
        found = counted_amounts(price, before, costs)
        assert found == expected, (costs, before)
        assert all(type(amount) is int for amount in found)


def test_the_linear_shortcut_keeps_the_fee_for_the_first_charge_only() -> None:
    fee = COUNTED[0]  # 2 cents a unit up to 10, a fee of 3.00
    assert counted_amounts(fee, 0, [0, 1, 2]) == [0, 302, 4]
    assert counted_amounts(fee, 3, [1, 2]) == [2, 4]
    # half a cent, then whole cents: 0.5 rounds to 0, 1.5 to 2, 2.5 to 2
    assert counted_amounts(COUNTED[1], 1, [1, 1]) == [2, 0]
    assert counted_amounts(COUNTED[1], 999, [1, 1]) == [2, 0]  # 998.5 to 998, 999.5 to 1000


def test_priced_charges_count_each_counter_apart_and_in_order() -> None:
    fee = Price("calls", "USD", 10**6, 0, flat_fee=100)  # 0.01 a unit, 1.00 a window
    tiered = _price("graduated", ((2, 10**6), (None, 2 * 10**6)))
    prices = {"calls": (fee,), "tiered": (tiered,)}
    charges = [("a", "calls", 1), ("b", "calls", 1), ("a", "calls", 2), ("a", "calls", 1)]
    # as the event is read (no counters): each counter's first charge pays the fee
    assert [c.amount for c in priced_charges(charges, prices, 0)] == [101, 101, 2, 1]
    assert [c.amount for c in priced_charges(charges, prices, 0, used=[0, 0, 0, 0])] == [
        101,
        101,
        2,
        1,
    ]
    assert [c.amount for c in priced_charges(charges, prices, 0, used=[4, 0, 4, 4])] == [
        1,
        101,
        2,
        1,
    ]
    # tiers: 1 cent up to 2 units, 2 cents after, counted from what came before
    steps = [("a", "tiered", 1)] * 4
    assert [c.amount for c in priced_charges(steps, prices, 0)] == [1, 1, 2, 2]
    assert [c.amount for c in priced_charges(steps, prices, 0, used=[1] * 4)] == [1, 2, 2, 2]


def test_a_price_effective_at_the_instant_replaces_the_one_before() -> None:
    first, second = Price("calls", "USD", 1, 0), Price("calls", "USD", 2, 10)
    assert prices_from((first, second), 10) == [second]
    assert prices_from((first, second), 9) == [first, second]


def test_a_bound_amount_starts_its_window_unless_told_otherwise() -> None:
    fee = Price("calls", "USD", 10**6, 0, flat_fee=100)
    assert bounded_amount(2, fee) == 102
    assert bounded_amount(2, fee, 3) == 2


def test_a_windows_price_per_model() -> None:
    assert window_price(Price("calls", "USD", 1_500_000, 0), 3) == 4_500_000
    free_first = _price("volume", ((10, 0), (None, 10**6)))
    assert window_price(free_first, 5) == 0
    assert window_price(free_first, 0) == 0
