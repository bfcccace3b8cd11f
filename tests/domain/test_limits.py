"""Limits: period parsing, validation of a limit definition, from_dict/to_dict."""

from __future__ import annotations

from typing import Any

import pytest

from metering.domain.limits import (
    Limit,
    Period,
    is_reserved,
    parse_period,
    spend_limit,
    validate_limit_name,
)
from metering.errors import InvalidInput, InvalidLimit

DAY = 86_400


def limit(**overrides: object) -> Limit:
    """A valid limit with some fields replaced."""
    fields: dict[str, object] = {"name": "send_message", "maximum": 5, "period": "2m"}
    fields.update(overrides)
    return Limit(**fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- periods


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", Period(seconds=30)),
        ("2m", Period(seconds=120)),
        ("1h", Period(seconds=3600)),
        ("1d", Period(seconds=DAY)),
        ("7d", Period(seconds=7 * DAY)),
        ("2w", Period(seconds=14 * DAY)),
        ("1mo", Period(months=1)),
        ("3mo", Period(months=3)),
        ("1y", Period(months=12)),
        ("10y", Period(months=120)),
        ("120mo", Period(months=120)),
        ("3650d", Period(seconds=3650 * DAY)),
    ],
)
def test_parse_period_accepts_each_unit(text: str, expected: Period) -> None:
    assert parse_period(text) == expected


@pytest.mark.parametrize("text", [" 2m", "2m ", "  2m\t", "2 m", " 1 mo "])
def test_parse_period_ignores_surrounding_whitespace(text: str) -> None:
    parsed = parse_period(text)
    assert parsed == (Period(months=1) if "mo" in text else Period(seconds=120))


def test_month_periods_are_calendar_months_and_second_periods_are_not() -> None:
    assert parse_period("1mo").is_calendar_months
    assert parse_period("1y").is_calendar_months
    assert not parse_period("30d").is_calendar_months
    assert parse_period("1mo").seconds == 0
    assert parse_period("1d").months == 0


@pytest.mark.parametrize(
    "text",
    ["0s", "0mo", "0y", "-1m", "1.5h", "abc", "1x", "", "   ", "m", "10", "1 h 2", "1hh", "1M"],
)
def test_parse_period_rejects_malformed_text(text: str) -> None:
    with pytest.raises(InvalidLimit) as caught:
        parse_period(text)
    assert caught.value.field == "period"


@pytest.mark.parametrize("value", [None, 30, 1.5, b"2m", ["2m"], True])
def test_parse_period_rejects_non_strings(value: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        parse_period(value)  # type: ignore[arg-type]
    assert caught.value.field == "period"


@pytest.mark.parametrize("text", ["11y", "121mo", "3661d", "600w", "100000h", "10" * 12 + "s"])
def test_parse_period_rejects_periods_over_ten_years(text: str) -> None:
    with pytest.raises(InvalidLimit, match="10 years") as caught:
        parse_period(text)
    assert caught.value.field == "period"


def test_parse_period_names_the_field_it_parses() -> None:
    with pytest.raises(InvalidLimit) as caught:
        parse_period("soon", field_name="lateness")
    assert caught.value.field == "lateness"
    assert str(caught.value).startswith("lateness:")


def test_invalid_limit_is_an_invalid_input_and_a_value_error() -> None:
    with pytest.raises(InvalidLimit) as caught:
        parse_period("abc")
    assert isinstance(caught.value, InvalidInput)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("period", "text"),
    [
        (Period(seconds=30), "30s"),
        (Period(seconds=90), "90s"),
        (Period(seconds=120), "2m"),
        (Period(seconds=3600), "1h"),
        (Period(seconds=5400), "90m"),
        (Period(seconds=DAY), "1d"),
        (Period(seconds=7 * DAY), "1w"),
        (Period(seconds=14 * DAY), "2w"),
        (Period(seconds=10 * DAY), "10d"),
        (Period(months=1), "1mo"),
        (Period(months=3), "3mo"),
        (Period(months=12), "1y"),
        (Period(months=18), "18mo"),
        (Period(months=24), "2y"),
    ],
)
def test_str_of_a_period_is_its_shortest_text(period: Period, text: str) -> None:
    assert str(period) == text


@pytest.mark.parametrize(
    "text", ["30s", "59s", "61s", "2m", "1h", "1d", "7d", "2w", "45m", "1mo", "3mo", "1y", "18mo"]
)
def test_str_of_a_parsed_period_parses_back_to_the_same_period(text: str) -> None:
    period = parse_period(text)
    assert parse_period(str(period)) == period


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["a", "send_message", "api.v2:calls-per_user", "0", "x" * 64])
def test_limit_name_accepts_the_documented_charset(name: str) -> None:
    assert validate_limit_name(name) == name
    assert limit(name=name).name == name


@pytest.mark.parametrize(
    "name",
    ["", "x" * 65, "Send", "send message", "send/message", "émail", "a\n", " a", None, 5, b"a"],
)
def test_limit_name_rejects_anything_else(name: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(name=name)
    assert caught.value.field == "name"


# --------------------------------------------------------------------------- maximum


@pytest.mark.parametrize("maximum", [1, 5, 10**15])
def test_maximum_accepts_whole_numbers_from_one_to_the_ceiling(maximum: int) -> None:
    assert limit(maximum=maximum).maximum == maximum


@pytest.mark.parametrize("maximum", [0, -1, True, False, 1.5, 5.0, "5", None, 10**15 + 1, 10**100])
def test_maximum_rejects_zero_negative_bool_float_and_huge(maximum: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(maximum=maximum)
    assert caught.value.field == "maximum"


# --------------------------------------------------------------------------- choices


def test_limit_defaults_are_a_hard_first_use_fixed_window() -> None:
    made = limit()
    assert made.algorithm == "fixed_window"
    assert made.window == "first_use"
    assert made.enforcement == "hard"
    assert made.thresholds == ()
    assert made.lateness == "1d"
    assert made.lateness_seconds == DAY
    assert made.period_seconds == 120
    assert made.parsed_period == Period(seconds=120)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("algorithm", "leaky_bucket"),
        ("algorithm", "FIXED_WINDOW"),
        ("algorithm", None),
        ("window", "sliding"),
        ("window", ""),
        ("enforcement", "strict"),
        ("enforcement", "Hard"),
    ],
)
def test_unknown_algorithm_window_or_enforcement_is_rejected(field: str, value: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(**{field: value})
    assert caught.value.field == field


def test_broken_period_in_a_limit_names_the_period_field() -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(period="2 minutes")
    assert caught.value.field == "period"


def test_limit_period_is_stored_without_surrounding_whitespace() -> None:
    made = limit(period="  1h ")
    assert made.period == "1h"
    assert made.period_seconds == 3600
    assert made == limit(period="1h")


def test_calendar_month_limit_has_no_period_seconds() -> None:
    made = limit(period="1mo", window="calendar")
    assert made.period_seconds == 0
    assert made.parsed_period == Period(months=1)


@pytest.mark.parametrize("period", ["1mo", "3mo", "1y"])
def test_token_bucket_over_calendar_months_is_rejected(period: str) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(algorithm="token_bucket", period=period)
    assert caught.value.field == "period"


def test_token_bucket_over_seconds_is_accepted() -> None:
    made = limit(name="api", maximum=10, period="10s", algorithm="token_bucket")
    assert made.period_seconds == 10


def test_soft_token_bucket_is_rejected() -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(algorithm="token_bucket", period="10s", enforcement="soft")
    assert caught.value.field == "enforcement"


def test_a_token_bucket_with_a_calendar_window_is_rejected() -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(algorithm="token_bucket", period="10s", window="calendar")
    assert caught.value.field == "window"
    # The default window, named or not, is a bucket's; calendar stays a fixed window's.
    named = limit(algorithm="token_bucket", period="10s", window="first_use")
    assert named == limit(algorithm="token_bucket", period="10s")
    assert limit(period="10s", window="calendar").window == "calendar"
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict(
            {"maximum": 9, "period": "10s", "algorithm": "token_bucket", "window": "calendar"},
            name="api",
        )
    assert caught.value.field == "window"


def test_soft_fixed_window_is_accepted() -> None:
    assert limit(enforcement="soft").enforcement == "soft"


# --------------------------------------------------------------------------- thresholds


def test_thresholds_are_deduplicated_and_sorted() -> None:
    assert limit(thresholds=(100, 80, 80, 50)).thresholds == (50, 80, 100)


def test_thresholds_given_as_a_list_become_a_tuple() -> None:
    made = limit(thresholds=[100, 80])
    assert made.thresholds == (80, 100)
    hash(made)  # a limit stays hashable


@pytest.mark.parametrize("thresholds", [(1,), (100,), (1000,), (80, 100, 150)])
def test_thresholds_accept_percentages_from_1_to_1000(thresholds: tuple[int, ...]) -> None:
    assert limit(thresholds=thresholds).thresholds == tuple(sorted(thresholds))


@pytest.mark.parametrize(
    "thresholds", [(0,), (-10,), (1001,), (80, 0), (True,), (80.5,), ("80",), (None,), "80"]
)
def test_thresholds_out_of_range_or_not_whole_numbers_are_rejected(thresholds: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(thresholds=thresholds)
    assert caught.value.field == "thresholds"


@pytest.mark.parametrize("thresholds", [80, None])
def test_thresholds_that_are_not_a_collection_are_rejected_as_invalid_limit(
    thresholds: object,
) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(thresholds=thresholds)
    assert caught.value.field == "thresholds"


# --------------------------------------------------------------------------- lateness


@pytest.mark.parametrize(("lateness", "seconds"), [("30m", 1800), ("1d", DAY), ("7d", 7 * DAY)])
def test_lateness_is_parsed_to_seconds(lateness: str, seconds: int) -> None:
    assert limit(lateness=lateness).lateness_seconds == seconds


@pytest.mark.parametrize("lateness", ["1mo", "1y", "0s", "soon", "", 5])
def test_lateness_in_months_or_malformed_is_rejected_naming_lateness(lateness: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(lateness=lateness)
    assert caught.value.field == "lateness"


# --------------------------------------------------------------------------- from_dict / to_dict


def test_from_dict_builds_the_same_limit_as_the_constructor() -> None:
    data = {
        "name": "seats",
        "maximum": 1000,
        "period": "1mo",
        "window": "calendar",
        "enforcement": "soft",
        "thresholds": [100, 80],
        "lateness": "2h",
    }
    made = Limit.from_dict(data)
    assert made == Limit(
        "seats",
        maximum=1000,
        period="1mo",
        window="calendar",
        enforcement="soft",
        thresholds=(80, 100),
        lateness="2h",
    )
    assert made.lateness_seconds == 7200


def test_from_dict_of_to_dict_round_trips() -> None:
    original = Limit("api", maximum=10, period="10s", algorithm="token_bucket", thresholds=(50, 90))
    assert Limit.from_dict(original.to_dict()) == original
    assert original.to_dict()["thresholds"] == [50, 90]


def test_from_dict_rejects_an_unknown_field_by_name() -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({"name": "a", "maximum": 1, "period": "1m", "burst": 3})
    assert caught.value.field == "burst"


@pytest.mark.parametrize("missing", ["name", "maximum", "period"])
def test_from_dict_rejects_a_missing_required_field_by_name(missing: str) -> None:
    data = {"name": "a", "maximum": 1, "period": "1m"}
    del data[missing]
    with pytest.raises(InvalidLimit, match="required") as caught:
        Limit.from_dict(data)
    assert caught.value.field == missing


def test_from_dict_takes_the_name_given_separately() -> None:
    # A limits file maps a name to its fields.
    made = Limit.from_dict({"maximum": 5, "period": "2m"}, name="send_message")
    assert made == Limit("send_message", maximum=5, period="2m")


def test_from_dict_validates_a_separately_given_name() -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({"maximum": 5, "period": "2m"}, name="Send Message")
    assert caught.value.field == "name"


def test_from_dict_rejects_thresholds_that_are_not_a_list() -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({"name": "a", "maximum": 1, "period": "1m", "thresholds": 80})
    assert caught.value.field == "thresholds"


def test_from_dict_validates_values_like_the_constructor() -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({"name": "a", "maximum": "5", "period": "1m"})
    assert caught.value.field == "maximum"


# --------------------------------------------------- absolute thresholds, entitlements


def test_absolute_thresholds_are_amounts_of_usage_up_to_the_maximums_ceiling() -> None:
    made = limit(thresholds_units=[10**15, 7, 7, 1])
    assert made.thresholds_units == (1, 7, 10**15)
    assert made.thresholds == ()
    for bad, message in [
        (0, "thresholds_units: must be between 1 and 1000000000000000, got 0"),
        (
            10**15 + 1,
            "thresholds_units: must be between 1 and 1000000000000000, got 1000000000000001",
        ),
        ("5", "thresholds_units: must be a whole number, got '5'"),
    ]:
        with pytest.raises(InvalidLimit) as caught:
            limit(thresholds_units=(bad,))
        assert str(caught.value) == message
        assert caught.value.field == "thresholds_units"
    with pytest.raises(InvalidLimit) as caught:
        limit(thresholds_units="50")
    assert str(caught.value) == "thresholds_units: must be a list of amounts of usage"
    with pytest.raises(InvalidLimit) as caught:
        limit(thresholds=80)
    assert str(caught.value) == "thresholds: must be a list of percentages"


def test_at_most_sixteen_thresholds_of_each_kind() -> None:
    assert len(limit(thresholds=range(1, 17)).thresholds) == 16
    assert len(limit(thresholds_units=range(1, 17)).thresholds_units) == 16
    for field in ("thresholds", "thresholds_units"):
        with pytest.raises(InvalidLimit) as caught:
            limit(**{field: range(1, 18)})
        assert str(caught.value) == f"{field}: at most 16, got 17"
        assert caught.value.field == field


def test_from_dict_names_what_a_threshold_list_holds() -> None:
    base = {"name": "a", "maximum": 1, "period": "1m"}
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({**base, "thresholds_units": 5})
    assert str(caught.value) == "thresholds_units: must be a list of amounts of usage, got 5"
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({**base, "thresholds": 5})
    assert str(caught.value) == "thresholds: must be a list of percentages, got 5"
    assert Limit.from_dict({**base, "thresholds_units": [3]}).thresholds_units == (3,)


def test_a_limit_with_a_subjects_own_maximum() -> None:
    original = limit(thresholds=(50,))
    assert original.with_maximum(5) is original
    own = original.with_maximum(8)
    assert own == limit(thresholds=(50,), maximum=8)
    assert (own.maximum, original.maximum) == (8, 5)


def test_dimensions_are_up_to_four_distinct_metadata_keys_in_the_order_given() -> None:
    assert limit().dimensions == ()
    assert limit(dimensions=["model", "route", "model"]).dimensions == ("model", "route")
    keys = ("A-z_.09", "x" * 64, "b", "a", "A-z_.09")
    assert limit(dimensions=keys).dimensions == ("A-z_.09", "x" * 64, "b", "a")
    with pytest.raises(InvalidLimit) as caught:
        limit(dimensions=("a", "b", "c", "d", "e"))
    assert (caught.value.field, str(caught.value)) == ("dimensions", "dimensions: at most 4 keys")


@pytest.mark.parametrize("keys", ["route", b"route", 5, None])
def test_dimensions_must_be_a_collection_of_keys(keys: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(dimensions=keys)
    assert caught.value.field == "dimensions"
    assert str(caught.value) == "dimensions: must be a list of metadata keys"


@pytest.mark.parametrize("key", ["", "a b", "x" * 65, "é", "a/b", 7, None])
def test_a_dimension_key_is_1_to_64_of_a_small_alphabet(key: object) -> None:
    with pytest.raises(InvalidLimit) as caught:
        limit(dimensions=("route", key))
    assert caught.value.field == "dimensions"
    assert caught.value.message.endswith(" must be 1 to 64 of a-z A-Z 0-9 _ . -")
    assert caught.value.message.startswith(repr(key)[:20])


def test_from_dict_takes_dimensions_as_a_list_only() -> None:
    base = {"name": "a", "maximum": 1, "period": "1m"}
    made = Limit.from_dict({**base, "dimensions": ["route", "model"]})
    assert made.dimensions == ("route", "model")
    assert Limit.from_dict(made.to_dict()) == made
    for bad in ("route", {"route": 1}, 5):
        with pytest.raises(InvalidLimit) as caught:
            Limit.from_dict({**base, "dimensions": bad})
        assert caught.value.field == "dimensions"
        assert str(caught.value) == f"dimensions: must be a list of metadata keys, got {bad!r}"


def test_the_products_own_limits_are_reserved() -> None:
    assert is_reserved("metering.events")
    assert not is_reserved("metering")
    assert not is_reserved("api.metering.x")


@pytest.mark.parametrize(
    ("make", "field", "message"),
    [
        (
            lambda: spend_limit("sp", "x", "EUR", "1mo"),
            "max_amount",
            "'x' is not an amount like 50 or 1.00",
        ),
        (lambda: spend_limit("sp", "0", "EUR", "1mo"), "max_amount", "must be more than 0 EUR"),
        (
            lambda: Limit("a", maximum=5, period="5s", algorithm="token_bucket", currency="EUR"),
            "currency",
            "a spend limit is a fixed window, not a bucket",
        ),
        (
            lambda: Limit("a", maximum=5, period="5s", algorithm="token_bucket", distinct="user"),
            "distinct",
            "a token bucket has no windows to count distinct values in",
        ),
        (
            lambda: Limit("a", maximum=5, algorithm="concurrent", distinct="user"),
            "distinct",
            "a concurrent limit holds licenses, not seats",
        ),
        (
            lambda: Limit("a", maximum=5, period="1mo", currency="EUR", distinct="user"),
            "distinct",
            "a spend limit counts money, not distinct values",
        ),
        (
            lambda: Limit("a", maximum=5, period="1mo", distinct="bad key!"),
            "distinct",
            "'bad key!' must be 1 to 64 of a-z A-Z 0-9 _ . -",
        ),
        (
            lambda: Limit.from_dict({"name": "a", "max_amount": "5", "period": "1mo"}),
            "currency",
            "a spend limit (max_amount) needs a currency",
        ),
        (
            lambda: Limit.from_dict(
                {"name": "a", "max_amount": "x", "currency": "EUR", "period": "1mo"}
            ),
            "max_amount",
            "'x' is not an amount like 50 or 1.00",
        ),
    ],
)
def test_a_bad_spend_or_seat_limit_names_its_field(make: Any, field: str, message: str) -> None:
    with pytest.raises((InvalidLimit, InvalidInput)) as raised:
        make()
    assert (raised.value.field, str(raised.value)) == (field, f"{field}: {message}")


def test_the_smallest_spend_limit_and_its_options() -> None:
    smallest = spend_limit("sp", "0.01", "EUR", "1mo", window="calendar", enforcement="soft")
    assert (smallest.maximum, smallest.currency, smallest.window, smallest.enforcement) == (
        1,
        "EUR",
        "calendar",
        "soft",
    )


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        (
            {"period": "10s", "algorithm": "token_bucket"},
            "aggregation",
            "a gauge is a fixed window, not a bucket or licenses",
        ),
        (
            {"algorithm": "concurrent"},
            "aggregation",
            "a gauge is a fixed window, not a bucket or licenses",
        ),
        (
            {"period": "1h", "distinct": "user"},
            "aggregation",
            "a gauge reports a level; seats (distinct) count values",
        ),
        (
            {"period": "1h", "currency": "USD"},
            "aggregation",
            "a spend limit adds money up; a gauge reports a level",
        ),
        (
            {"period": "1h", "dimensions": ("r",)},
            "dimensions",
            "a gauge's levels do not add up by dimension",
        ),
    ],
)
def test_what_a_gauge_cannot_be_is_refused_word_for_word(
    options: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(InvalidLimit) as refused:
        Limit("x", maximum=10, aggregation="max", **options)
    assert (refused.value.field, str(refused.value)) == (field, f"{field}: {message}")


def test_a_quarantined_limit_is_the_same_limit_held_to_its_cap() -> None:
    paced = Limit(
        "p", maximum=100, period="1d", window="calendar", pacing=True, burst=5, breaker="4x"
    )
    assert paced.quarantined() == Limit("p", maximum=25, period="1d", window="calendar")
    shadow = Limit(
        "s", maximum=100, period="1d", enforcement="shadow", breaker="4x", quarantine_max=7
    )
    assert shadow.quarantined() == Limit("s", maximum=7, period="1d", enforcement="shadow")
    chosen = Limit("c", maximum=5, period="1d", breaker="4x", quarantine_max=7)
    assert chosen.quarantined().maximum == 5  # never more than the maximum
    with pytest.raises(AssertionError, match="a limit without a breaker"):
        Limit("n", maximum=5, period="1d").quarantined()


def test_a_limits_dict_names_a_forecast_lead_and_a_breaker_only_when_set() -> None:
    plain = Limit("x", maximum=10, period="1h").to_dict()
    assert "forecast_lead" not in plain and "breaker" not in plain
    assert "quarantine_max" not in plain
    assert (
        Limit("x", maximum=10, period="1h", forecast_lead="1h").to_dict()["forecast_lead"] == "1h"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"forecast_lead": "soon"},
            "'soon' is not a period; use a number and s, m, h, d, w, mo or y",
        ),
        ({"forecast_lead": "0s"}, "'0s' must be longer than zero"),
        ({"forecast_lead": "1mo"}, "use seconds, minutes, hours, days or weeks, above 0"),
        ({"forecast_lead": "1y"}, "use seconds, minutes, hours, days or weeks, above 0"),
        (
            {"forecast_lead": "1h", "period": "1m", "algorithm": "token_bucket"},
            "only a fixed window that adds costs up runs out before its reset",
        ),
        (
            {"forecast_lead": "1h", "aggregation": "max"},
            "only a fixed window that adds costs up runs out before its reset",
        ),
        (
            {"forecast_lead": "1h", "period": "", "algorithm": "concurrent"},
            "only a fixed window that adds costs up runs out before its reset",
        ),
    ],
)
def test_a_bad_forecast_lead_is_refused_word_for_word(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidLimit) as refused:
        limit(**{"period": "1h", **options})
    assert (refused.value.field, str(refused.value)) == (
        "forecast_lead",
        f"forecast_lead: {message}",
    )


def test_a_forecast_lead_is_seconds_to_weeks_from_one_second() -> None:
    shortest = limit(period="1h", forecast_lead=" 1s ")
    assert (shortest.forecast_lead, shortest.forecast_lead_seconds) == ("1s", 1)
    weeks = limit(period="1mo", window="calendar", forecast_lead="14d")
    assert (weeks.forecast_lead, weeks.forecast_lead_seconds) == ("2w", 14 * DAY)
    none = limit()
    assert (none.forecast_lead, none.forecast_lead_seconds) == (None, None)


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        (
            {"breaker_floor": 1.0},
            "breaker_floor",
            "only a limit with a breaker has one: add breaker",
        ),
        (
            {"quarantine_max": 1},
            "quarantine_max",
            "only a limit with a breaker has one: add breaker",
        ),
        (
            {"breaker_floor": 1.0, "quarantine_max": 1},
            "breaker_floor",
            "only a limit with a breaker has one: add breaker",
        ),
        (
            {"breaker": "10x", "algorithm": "token_bucket"},
            "breaker",
            "only a fixed window that adds costs up has a breaker",
        ),
        (
            {"breaker": "10x", "aggregation": "latest"},
            "breaker",
            "only a fixed window that adds costs up has a breaker",
        ),
        (
            {"breaker": "10x", "period": "", "algorithm": "concurrent"},
            "breaker",
            "only a fixed window that adds costs up has a breaker",
        ),
        (
            {"breaker": "1x"},
            "breaker",
            "give a multiple like '10x', from 2x to 1000x; got '1x'",
        ),
        (
            {"breaker": "10x", "quarantine_max": 0},
            "quarantine_max",
            "give a whole number of units from 1; got 0",
        ),
        (
            {"breaker": "10x", "breaker_floor": "fast"},
            "breaker_floor",
            "give a rate in units per second above 0, like 0.5; got 'fast'",
        ),
    ],
)
def test_a_bad_breaker_is_refused_word_for_word(
    options: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(InvalidLimit) as refused:
        limit(**options)
    assert (refused.value.field, str(refused.value)) == (field, f"{field}: {message}")


def test_only_a_limit_with_a_breaker_can_be_quarantined() -> None:
    with pytest.raises(AssertionError) as refused:
        limit().quarantined()
    assert str(refused.value) == "a limit without a breaker"


def test_a_window_holds_the_maximum_by_default_and_a_token_bucket_has_no_window() -> None:
    assert Limit("calls", maximum=7, period="1d").window_maximum == 7
    assert Limit("api", maximum=7, period="10s", algorithm="token_bucket").window_maximum is None
