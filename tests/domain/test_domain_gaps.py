"""Behaviour that mutation testing found unasserted (mutmut survivors).

* a token bucket's ``used`` (tokens taken ever: written to the database and
  shown in reports);
* ``overage`` on the charges of a denied stacked event;
* calendar windows of periods that do not divide a year (``5mo``, ``2y``);
* and, once mutation testing covered the whole domain: windows that start
  at the epoch, an event at the very first microsecond of a first-use
  window, the exact text of a fingerprint, metadata's size counted as
  compact JSON, a period's length limits, `charges_of` and
  `UsageEvent.record`;
* and, for entitlements, grants, corrections and usage by dimension (whose
  own tests, ``test_grants.py`` and ``test_rollups.py``, mutation testing
  does not run): the exact arithmetic of a window topped up by grants,
  the validators' messages, what a void takes back, and the rollups' rules.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest

from metering.domain.buckets import evaluate_bucket
from metering.domain.corrections import VoidedCharge, take_back, validate_reason, voided_charges
from metering.domain.decisions import ChargeDecision, ChargeInput, decide_event
from metering.domain.events import (
    Charge,
    EventRecord,
    charges_of,
    fingerprint_of,
    make_event,
    validate_metadata,
)
from metering.domain.grants import (
    Balance,
    Entitlement,
    Pot,
    WindowFit,
    fit_window,
    maximum_at,
    validate_amount,
    validate_grant_id,
)
from metering.domain.instants import from_us, to_us
from metering.domain.limits import MAX_PERIOD_CHARS, Limit, Period, parse_period
from metering.domain.rollups import (
    dimension_value,
    given_back_deltas,
    hour_start_us,
    rollup_deltas,
    rollup_rows,
    shown_value,
)
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import calendar_window, first_use_window
from metering.errors import InvalidInput, InvalidLimit

SECOND = 1_000_000
NOW_US = to_us(datetime(2026, 11, 23, 12, 0, tzinfo=UTC))


def test_a_bucket_counts_every_token_it_grants_and_none_it_refuses() -> None:
    bucket = Limit("api", maximum=3, period="1s", algorithm="token_bucket")
    state = CounterState(used=40)

    granted = evaluate_bucket(bucket, state, 2, NOW_US)
    assert granted.fits and granted.applied.used == 42

    refused = evaluate_bucket(bucket, granted.applied, 2, NOW_US)
    assert not refused.fits
    assert refused.denied.used == 42
    assert (refused.denied.denied_count, refused.denied.denied_cost) == (1, 2)


def test_a_denied_stacked_event_reports_each_soft_charges_standing_overage() -> None:
    """The hard charge refuses the event; the soft one, already past its
    maximum, still reports how far past it stands, without consuming."""
    hard = Limit("seats", maximum=2, period="1d", window="calendar")
    soft = Limit("calls", maximum=10, period="1d", window="calendar", enforcement="soft")
    start, end = calendar_window(hard.parsed_period, NOW_US)
    verdict = decide_event(
        [
            ChargeInput(hard, CounterKey("seats", "org", start, end), CounterState(used=2), 1),
            ChargeInput(soft, CounterKey("calls", "org", start, end), CounterState(used=13), 4),
        ],
        NOW_US,
    )
    assert verdict.outcome == "denied" and verdict.denied_by == ("seats",)
    seats, calls = verdict.charges
    assert (seats.overage, calls.overage) == (0, 3)
    assert (calls.used, calls.allowed) == (13, True)
    assert verdict.new_states[1] == CounterState(used=13)


@pytest.mark.parametrize(
    ("period", "at", "start", "end"),
    [
        # Five-month windows counted from January 1970: month 615 starts one.
        ("5mo", datetime(2021, 5, 9, tzinfo=UTC), datetime(2021, 4, 1), datetime(2021, 9, 1)),
        ("5mo", datetime(1970, 12, 31, tzinfo=UTC), datetime(1970, 11, 1), datetime(1971, 4, 1)),
        # Two-year windows start on even years since 1970.
        ("2y", datetime(2027, 6, 1, tzinfo=UTC), datetime(2026, 1, 1), datetime(2028, 1, 1)),
        ("2y", datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1), datetime(2028, 1, 1)),
        ("7mo", datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 8, 1), datetime(2027, 3, 1)),
    ],
)
def test_calendar_windows_of_periods_that_do_not_divide_a_year(
    period: str, at: datetime, start: datetime, end: datetime
) -> None:
    window = calendar_window(parse_period(period), to_us(at))
    assert (from_us(window[0]), from_us(window[1])) == (
        start.replace(tzinfo=UTC),
        end.replace(tzinfo=UTC),
    )


def test_a_bucket_charge_has_no_window() -> None:
    bucket = Limit("api", maximum=3, period="1s", algorithm="token_bucket")
    key = CounterKey("api", "org", NO_WINDOW, NO_WINDOW)
    [charge] = decide_event([ChargeInput(bucket, key, CounterState(), 1)], NOW_US).charges
    assert charge.window_start_us is None and charge.used == 1


def test_a_calendar_window_that_starts_at_the_epoch_keeps_its_start() -> None:
    """Window start 0 is a window like any other; only buckets have none."""
    monthly = Limit("calls", maximum=5, period="1mo", window="calendar")
    at = to_us(datetime(1970, 1, 15, tzinfo=UTC))
    start, end = calendar_window(monthly.parsed_period, at)
    assert start == 0 == NO_WINDOW
    key = CounterKey("calls", "org", start, end)
    [charge] = decide_event([ChargeInput(monthly, key, CounterState(), 1)], at).charges
    assert charge.window_start_us == 0
    assert charge.window_start == datetime(1970, 1, 1, tzinfo=UTC)


def test_an_event_at_the_first_microsecond_of_a_window_falls_in_it() -> None:
    """Even when the period changed since: the open window is the subject's."""
    window = (NOW_US, NOW_US + 60_000_000)
    assert first_use_window(parse_period("2m"), NOW_US, window, None) == window


def test_a_fingerprint_is_compact_json_of_the_sorted_charges() -> None:
    """Stored beside each result: another text would make every repeat a conflict."""
    charges = [("user-7", "calls", 2), ("org", "seats", 1)]
    assert fingerprint_of(charges) == '[["org","seats",1],["user-7","calls",2]]'
    event = make_event(charges, datetime(2026, 1, 1, tzinfo=UTC), event_id="e")
    assert event.fingerprint() == '[["org","seats",1],["user-7","calls",2]]'


def test_metadata_size_is_counted_as_compact_json() -> None:
    overhead = len('{"a":"","b":""}')
    fits = {"a": "x" * (8192 - overhead), "b": ""}
    assert validate_metadata(fits) == fits
    with pytest.raises(InvalidInput, match="larger than 8192 bytes"):
        validate_metadata({"a": "x" * (8193 - overhead), "b": ""})


def test_a_period_is_at_most_32_characters_and_ten_years() -> None:
    padded = "1d".ljust(MAX_PERIOD_CHARS)
    assert parse_period(padded) == Period(seconds=86_400)
    with pytest.raises(InvalidLimit, match="longer than 32 characters"):
        parse_period(padded + " ")
    assert parse_period("3653d") == Period(seconds=3653 * 86_400)
    assert parse_period("120mo") == Period(months=120)


def test_leading_zeros_of_a_period_do_not_count_as_digits() -> None:
    assert parse_period("0000000000000001s") == Period(seconds=1)


def test_charges_of_takes_one_charge_or_a_list() -> None:
    assert charges_of("org", "calls", 3, None) == [("org", "calls", 3)]
    given = [("org", "calls", 1)]
    assert charges_of(None, None, 1, given) is given


def test_an_event_record_is_the_event_as_plain_values() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    event = make_event([("org", "calls", 2)], at, event_id="e1", metadata={"k": 1})
    assert event.record() == EventRecord(
        "e1", (Charge("org", "calls", 2),), to_us(at), {"k": 1}, '[["org","calls",2]]'
    )


# -- grants and corrections (metering.domain.grants, metering.domain.corrections) --


def test_the_maximum_at_an_instant_follows_the_subjects_changes() -> None:
    history = ((100, 7), (200, None), (300, 9))
    at = (0, 99, 100, 150, 199, 200, 250, 299, 300, 301)
    assert [maximum_at(history, 5, us) for us in at] == [5, 5, 7, 7, 7, 5, 5, 5, 9, 9]
    assert maximum_at(((0, 3),), 5, 0) == 3  # a change at the epoch applies at once
    assert maximum_at((), 5, 10) == 5
    assert maximum_at(None, 5, 10) == 5


def test_a_balance_is_active_from_its_start_to_just_before_its_expiry() -> None:
    timed = Balance("g", amount=10, used=4, effective_from_us=100, expires_at_us=200)
    assert [timed.active_at(us) for us in (99, 100, 101, 199, 200, 201)] == [
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    lasting = Balance("g", amount=1, used=0, effective_from_us=100, expires_at_us=None)
    assert [lasting.active_at(us) for us in (99, 100, 2**62)] == [False, True, True]
    assert timed.left == 6
    # Priority first (the default for both), then expiry (issue 22).
    assert timed.order() == (100, 200, 100, "g")
    assert lasting.order() == (100, 2**62, 100, "g")


def test_a_pot_sorts_its_grants_earliest_expiring_then_earliest_given_then_by_id() -> None:
    pot = Pot(
        [
            Balance("lasting", 5, 0, 0, None),
            Balance("late-b", 5, 0, 50, 2**61),
            Balance("late-a", 5, 0, 50, 2**61),
            Balance("given-first", 5, 0, 10, 2**61),
            Balance("soon", 5, 0, 60, 500),
        ]
    )
    assert [b.grant_id for b in pot.balances] == [
        "soon",
        "given-first",
        "late-a",
        "late-b",
        "lasting",
    ]


def test_a_pot_offers_what_its_active_grants_have_left() -> None:
    pot = Pot(
        [
            Balance("one-left", 4, 3, 0, 1000),
            Balance("spent", 4, 4, 0, 1000),
            Balance("overdrawn", 4, 6, 0, 1000),  # never drawn on: it counts as empty
            Balance("later", 7, 0, 500, None),
            Balance("expired", 9, 0, 0, 300),
        ]
    )
    assert [pot.available(us) for us in (0, 299, 300, 499, 500, 999, 1000)] == [
        10,
        10,
        1,
        1,
        8,
        8,
        7,
    ]


def test_a_plan_draws_each_grant_as_far_as_it_goes_and_stops_when_paid() -> None:
    pot = Pot(
        [
            Balance("a", 3, 0, 0, 100),
            Balance("spent", 3, 3, 0, 150),
            Balance("b", 2, 1, 0, 200),
            Balance("not-yet", 9, 0, 50, 300),
            Balance("c", 5, 0, 0, 400),
        ]
    )
    assert pot.plan(3, 10) == [("a", 3)]  # paid in full: the others are not touched
    assert pot.plan(4, 10) == [("a", 3), ("b", 1)]
    assert pot.plan(6, 10) == [("a", 3), ("b", 1), ("c", 2)]
    assert pot.plan(6, 60) == [("a", 3), ("b", 1), ("not-yet", 2)]
    assert pot.plan(20, 10) == [("a", 3), ("b", 1), ("c", 5)]  # as much as there is
    assert pot.plan(0, 10) == []
    assert pot.plan(1, 100) == [("b", 1)]  # a expired at 100


def test_taking_draws_uses_the_grants_and_counts_them_per_window() -> None:
    pot = Pot([Balance("a", 5, 1, 0, None), Balance("b", 5, 0, 0, None)])
    pot.take(1000, [("a", 2), ("b", 3)])
    pot.take(2000, [("b", 1)])
    pot.take(1000, [("a", 1)])
    assert [(b.grant_id, b.used) for b in pot.balances] == [("a", 4), ("b", 4)]
    assert pot.granted == {1000: 6, 2000: 1}


def test_a_window_fit_pays_with_the_own_allowance_first_then_the_grants() -> None:
    def pot() -> Pot:
        return Pot([Balance("g1", 4, 1, 0, 500), Balance("g2", 2, 0, 0, None)])

    # maximum 10, used 7 of which 2 granted: own usage 5, own room 5; grants 3 + 2
    assert fit_window(10, 7, 2, 4, pot(), 100, soft=False) == WindowFit(
        fits=True,
        draws=(),
        remaining_before=10,
        remaining_after=6,
        overage_after=0,
        overage_before=0,
    )
    assert fit_window(10, 7, 2, 6, pot(), 100, soft=False) == WindowFit(
        fits=True,
        draws=(("g1", 1),),
        remaining_before=10,
        remaining_after=4,
        overage_after=0,
        overage_before=0,
    )
    assert fit_window(10, 7, 2, 10, pot(), 100, soft=False) == WindowFit(
        fits=True,
        draws=(("g1", 3), ("g2", 2)),
        remaining_before=10,
        remaining_after=0,
        overage_after=0,
        overage_before=0,
    )
    # one more than all of it: a hard limit takes nothing
    assert fit_window(10, 7, 2, 11, pot(), 100, soft=False) == WindowFit(
        fits=False,
        draws=(),
        remaining_before=10,
        remaining_after=0,
        overage_after=6,
        overage_before=0,
    )
    # a soft one draws every grant and the rest is overage
    assert fit_window(10, 7, 2, 11, pot(), 100, soft=True) == WindowFit(
        fits=False,
        draws=(("g1", 3), ("g2", 2)),
        remaining_before=10,
        remaining_after=0,
        overage_after=1,
        overage_before=0,
    )
    # at 500 g1 has expired: only g2 tops the window up
    assert fit_window(10, 7, 2, 6, pot(), 500, soft=False) == WindowFit(
        fits=True,
        draws=(("g2", 1),),
        remaining_before=7,
        remaining_after=1,
        overage_after=0,
        overage_before=0,
    )


def test_a_window_fit_past_its_own_maximum_has_only_the_grants_when_soft() -> None:
    pot = Pot([Balance("g", 3, 0, 0, None)])
    # maximum 4, used 7 of which 1 granted: 2 past the own maximum
    assert fit_window(4, 7, 1, 2, pot, 0, soft=False) == WindowFit(
        fits=False,
        draws=(),
        remaining_before=0,
        remaining_after=0,
        overage_after=4,
        overage_before=2,
    )
    assert fit_window(4, 7, 1, 2, pot, 0, soft=True) == WindowFit(
        fits=True,
        draws=(("g", 2),),
        remaining_before=3,
        remaining_after=1,
        overage_after=2,
        overage_before=2,
    )
    empty = Pot([Balance("g", 3, 3, 0, None)])
    assert fit_window(4, 7, 1, 2, empty, 0, soft=True) == WindowFit(
        fits=False,
        draws=(),
        remaining_before=0,
        remaining_after=0,
        overage_after=4,
        overage_before=2,
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "amount: must be between 1 and 1000000000000000, got 0"),
        (-1, "amount: must be between 1 and 1000000000000000, got -1"),
        (10**15 + 1, "amount: must be between 1 and 1000000000000000, got 1000000000000001"),
        (True, "amount: must be a whole number, got True"),
        (2.0, "amount: must be a whole number, got 2.0"),
        ("3", "amount: must be a whole number, got '3'"),
        (None, "amount: must be a whole number, got None"),
    ],
)
def test_an_amount_is_a_whole_number_from_one_to_the_ceiling(value: object, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_amount("amount", value)
    assert str(raised.value) == message
    assert raised.value.field == "amount"


def test_an_amount_may_be_one_or_the_ceiling() -> None:
    assert validate_amount("amount", 1) == 1
    assert validate_amount("amount", 10**15) == 10**15
    assert validate_amount("maximum", 7, ceiling=7) == 7
    with pytest.raises(InvalidInput, match=r"^maximum: must be between 1 and 7, got 8$"):
        validate_amount("maximum", 8, ceiling=7)


def test_a_grant_id_is_1_to_128_characters_of_a_small_alphabet() -> None:
    allowed = "Az09_.:@/+=-"
    assert validate_grant_id(allowed) == allowed
    assert validate_grant_id("g" * 128) == "g" * 128
    assert validate_grant_id("x", "id") == "x"
    for bad in ("", "a b", "é", "a\n", 7, None):
        with pytest.raises(InvalidInput) as raised:
            validate_grant_id(bad)
        assert str(raised.value) == (
            f"grant_id: {bad!r} must be 1 to 128 of A-Z a-z 0-9 and _ . : @ / + = -"
        )
    with pytest.raises(InvalidInput, match=r"^grant_id: 'ggg"):
        validate_grant_id("g" * 129)
    with pytest.raises(InvalidInput) as raised:
        validate_grant_id("a b", "id")
    assert raised.value.field == "id"


def test_a_reason_is_non_empty_printable_text_of_at_most_500_characters() -> None:
    assert validate_reason("x" * 500) == "x" * 500
    assert validate_reason(" duplicate ") == " duplicate "
    for bad in ("", "  ", None, 3):
        with pytest.raises(InvalidInput) as raised:
            validate_reason(bad)
        assert str(raised.value) == f"reason: must be a non-empty string, got {bad!r}"
    for bad in ("x" * 501, "tab\there", "line\n"):
        with pytest.raises(InvalidInput) as raised:
            validate_reason(bad)
        assert str(raised.value) == "reason: must be at most 500 printable characters"


def _stored(
    outcome: str, start: int | None, grants: tuple[tuple[str, int], ...] = ()
) -> list[object]:
    return ChargeDecision(
        subject="org",
        limit="calls",
        cost=4,
        allowed=outcome != "denied",
        outcome=outcome,  # type: ignore[arg-type]
        used=8,
        remaining=2,
        maximum=10,
        overage=0,
        window_start_us=start,
        resets_at_us=900,
        retry_at_us=None,
        grants=grants,
    ).to_row()


def test_a_void_reverses_each_charge_that_consumed_in_its_own_counter() -> None:
    rows = [
        _stored("allowed", 100, (("g", 1), ("h", 2))),
        _stored("would_deny", 100),
        _stored("overage", 300),
        _stored("denied", 100),
        _stored("allowed", None),
    ]
    expected = [
        VoidedCharge(CounterKey("calls", "org", 100, 900), 4, (("g", 1), ("h", 2))),
        VoidedCharge(CounterKey("calls", "org", 300, 900), 4, ()),
        VoidedCharge(CounterKey("calls", "org", NO_WINDOW, NO_WINDOW), 4, ()),
    ]
    assert voided_charges("allowed", rows) == expected
    assert voided_charges("overage", rows) == expected
    assert voided_charges("denied", rows) == []
    assert voided_charges("rejected", rows) == []


def test_a_voided_charge_row_names_its_counter_and_the_draws_given_back() -> None:
    charge = VoidedCharge(CounterKey("calls", "org", 100, 900), 4, (("g", 1),))
    assert charge.to_row([("g", 1), ("h", 2)]) == ["org", "calls", 4, 100, [["g", 1], ["h", 2]]]
    assert charge.to_row([]) == ["org", "calls", 4, 100, []]


def test_a_void_takes_a_windows_cost_back_down_to_zero_and_keeps_the_rest() -> None:
    window = Limit("calls", maximum=10, period="1h")
    charge = VoidedCharge(CounterKey("calls", "org", 100, 900), 4, ())
    counted = CounterState(used=9, denied_count=2, denied_cost=5, first_denied_at_us=150)
    assert take_back(window, charge, counted, 10**12, past_windows=True).state == replace(
        counted, used=5
    )
    assert take_back(
        window, charge, CounterState(used=4), 0, past_windows=True
    ).state == CounterState(used=0)
    assert take_back(
        window, charge, CounterState(used=3), 0, past_windows=True
    ).state == CounterState(used=0)
    assert take_back(
        None, charge, CounterState(used=9), 0, past_windows=True
    ).state == CounterState(used=5)
    bucket = Limit("calls", maximum=10, period="10s", algorithm="token_bucket")
    assert take_back(
        bucket, charge, CounterState(used=9), 0, past_windows=True
    ).state == CounterState(used=5)


def test_a_void_gives_a_bucket_its_tokens_back_as_of_now() -> None:
    bucket = Limit("api", maximum=10, period="10s", algorithm="token_bucket")
    charge = VoidedCharge(CounterKey("api", "org", NO_WINDOW, NO_WINDOW), 4, ())
    # empty at 0 s (full again at 10 s); at 1 s one token has come back
    empty = CounterState(used=10, denied_count=1, tat_us=10 * SECOND, tat_rem=0, tat_scale=10)
    assert take_back(bucket, charge, empty, SECOND, past_windows=True).state == CounterState(
        used=6, denied_count=1, tat_us=6 * SECOND, tat_rem=0, tat_scale=10
    )
    # at 7 s only 3 were missing: the arrival time cannot go before now
    assert take_back(bucket, charge, empty, 7 * SECOND, past_windows=True).state == CounterState(
        used=6, denied_count=1, tat_us=7 * SECOND, tat_rem=0, tat_scale=10
    )
    assert (
        take_back(None, charge, empty, SECOND, past_windows=True).state == empty
    )  # the bucket was deleted
    window = Limit("api", maximum=10, period="10s")
    assert (
        take_back(window, charge, empty, SECOND, past_windows=True).state == empty
    )  # redefined as a window


def test_an_entitlement_as_a_document() -> None:
    change = Entitlement("org", "calls", 20, NOW_US, NOW_US + 1)
    assert change.to_dict() == {
        "subject": "org",
        "limit": "calls",
        "maximum": 20,
        "effective_from": "2026-11-23T12:00:00+00:00",
        "created_at": "2026-11-23T12:00:00.000001+00:00",
    }
    assert Entitlement("org", "calls", None, 0).to_dict()["maximum"] is None


# -- usage by dimension (metering.domain.rollups) --------------------------------


@dataclass(frozen=True)
class Decided:
    outcome: str
    occurred_at_us: int
    charges: list[list[object]]
    metadata: dict[str, object] | None


HOUR = 3_600 * SECOND
AT = NOW_US + 17 * 60 * SECOND + 5  # 12:17 and 5 µs


def charge_row(subject: str, name: str, cost: int, outcome: str = "allowed") -> list[object]:
    return [subject, name, cost, outcome != "denied", outcome, 0, 0, 10, 0, None, 0, None]


def test_usage_counts_in_the_utc_hour_of_the_event() -> None:
    assert hour_start_us(AT) == NOW_US
    assert hour_start_us(NOW_US) == NOW_US
    assert hour_start_us(NOW_US - 1) == NOW_US - HOUR


@pytest.mark.parametrize(
    ("metadata", "value"),
    [
        (None, ""),
        ({}, ""),
        ({"route": None}, ""),
        ({"route": ""}, ""),
        ({"route": "/v1/é"}, "/v1/é"),
        ({"route": 3}, "3"),
        ({"route": 2.5}, "2.5"),
        ({"route": True}, "true"),
        ({"route": ["a", 1]}, '["a",1]'),
        ({"route": {"b": 1, "a": "é"}}, '{"a":"é","b":1}'),
        ({"route": "x" * 250}, "x" * 200),
        ({"route": "a\x00b"}, "a\\u0000b"),
        ({"other": "x"}, ""),
    ],
)
def test_a_dimension_value_is_the_text_or_compact_json_cut_to_200(
    metadata: dict[str, object] | None, value: str
) -> None:
    assert dimension_value(metadata, "route") == value


def test_a_missing_value_is_shown_as_none() -> None:
    assert shown_value("") == "(none)"
    assert shown_value("/v1") == "/v1"


def test_only_consumed_charges_of_dimensioned_limits_are_rolled_up() -> None:
    dimensions = {"api": ("route", "model"), "org": ("route",)}
    shadowed = [charge_row("s", "api", 5, "would_deny"), charge_row("o", "org", 2)]
    events = [
        Decided("denied", AT, [charge_row("s", "api", 9)], None),  # a denied event: none
        Decided("allowed", AT, [charge_row("s", "api", 3), charge_row("o", "org", 1)], None),
        Decided("rejected", AT, [], None),
        Decided("overage", AT + HOUR, [charge_row("s", "api", 2)], {"route": "/a", "model": 7}),
        Decided("allowed", AT, [charge_row("s", "api", 4)], {"route": None}),
        Decided("allowed", AT, shadowed, None),  # the shadow's would-deny consumed nothing
        Decided("allowed", AT, [charge_row("s", "plain", 6)], None),
    ]
    assert rollup_deltas(events, dimensions) == {
        ("s", "api", "route", NOW_US, ""): (7, 2),
        ("s", "api", "model", NOW_US, ""): (7, 2),
        ("o", "org", "route", NOW_US, ""): (3, 2),
        ("s", "api", "route", NOW_US + HOUR, "/a"): (2, 1),
        ("s", "api", "model", NOW_US + HOUR, "7"): (2, 1),
    }
    assert rollup_deltas(events[:2], dimensions, sign=-1) == {
        ("s", "api", "route", NOW_US, ""): (-3, -1),
        ("s", "api", "model", NOW_US, ""): (-3, -1),
        ("o", "org", "route", NOW_US, ""): (-1, -1),
    }
    assert rollup_deltas(events, {}) == {}
    assert rollup_deltas(events, {"other": ("route",)}) == {}


def test_a_cancelled_reservation_takes_back_its_units_and_a_wholly_returned_event() -> None:
    event = Decided("allowed", AT, [], {"route": "/r"})
    dimensions = {"api": ("route",), "org": ("route", "model")}
    returned = [("t", "api", 1, 0), ("s", "api", 5, 2), ("o", "org", 3, 3), ("s", "none", 4, 4)]
    assert given_back_deltas(event, returned, dimensions) == {
        ("s", "api", "route", NOW_US, "/r"): (-2, 0),
        ("o", "org", "route", NOW_US, "/r"): (-3, -1),
        ("o", "org", "model", NOW_US, ""): (-3, -1),
    }
    twice = [("s", "api", 5, 2), ("s", "api", 1, 1), ("s", "api", 2, 3)]
    assert given_back_deltas(event, twice, dimensions) == {
        ("s", "api", "route", NOW_US, "/r"): (-6, -2)
    }
    assert given_back_deltas(event, [("s", "api", 5, -1)], dimensions) == {}


def test_rollup_rows_come_sorted_by_key() -> None:
    deltas = {
        ("s", "b", "k", 2, "v"): (1, 1),
        ("s", "a", "k", 9, "v"): (2, 1),
        ("r", "z", "k", 1, "v"): (3, -1),
    }
    assert rollup_rows(deltas) == [
        ("r", "z", "k", 1, "v", 3, -1),
        ("s", "a", "k", 9, "v", 2, 1),
        ("s", "b", "k", 2, "v", 1, 1),
    ]
