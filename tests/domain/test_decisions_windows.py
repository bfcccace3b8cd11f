"""What a decision counts and the window it falls in, at the edges mutation
testing found unasserted: a token bucket's ``used`` (tokens taken ever:
written to the database and shown in reports), ``overage`` on the charges of
a denied stacked event, calendar windows of periods that do not divide a year
(``5mo``, ``2y``), a window that starts at the epoch, and an event at the very
first microsecond of a first-use window.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.domain.buckets import evaluate_bucket
from metering.domain.decisions import ChargeInput, decide_event
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit, parse_period
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import calendar_window, first_use_window

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
