"""Behaviour that mutation testing found unasserted (mutmut survivors).

* a token bucket's ``used`` (tokens taken ever: written to the database and
  shown in reports);
* ``overage`` on the charges of a denied stacked event;
* calendar windows of periods that do not divide a year (``5mo``, ``2y``);
* and, once mutation testing covered the whole domain: windows that start
  at the epoch, an event at the very first microsecond of a first-use
  window, the exact text of a fingerprint, metadata's size counted as
  compact JSON, a period's length limits, `charges_of` and
  `UsageEvent.record`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.domain.buckets import evaluate_bucket
from metering.domain.decisions import ChargeInput, decide_event
from metering.domain.events import (
    Charge,
    EventRecord,
    charges_of,
    fingerprint_of,
    make_event,
    validate_metadata,
)
from metering.domain.instants import from_us, to_us
from metering.domain.limits import MAX_PERIOD_CHARS, Limit, Period, parse_period
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import calendar_window, first_use_window
from metering.errors import InvalidInput, InvalidLimit

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
