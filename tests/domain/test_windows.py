"""Fixed windows: where a window starts and ends, and what a charge does to it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.clock import FrozenClock
from metering.domain import windows
from metering.domain.decisions import ChargeInput, EventVerdict, decide_event
from metering.domain.grants import Balance, Pot
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit, parse_period
from metering.domain.state import CounterKey, CounterState, Evaluation
from metering.domain.windows import (
    Window,
    _months_window,
    add_period,
    calendar_window,
    evaluate_window,
    first_use_window,
)

SECOND = 1_000_000
SUBJECT = "visitor-1"


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """A UTC instant in microseconds."""
    return to_us(datetime(year, month, day, hour, minute, second, tzinfo=UTC))


def window_at(*start: int, end: tuple[int, ...]) -> Window:
    return at(*start), at(*end)


def fixed(
    maximum: int = 5,
    period: str = "2m",
    *,
    window: str = "first_use",
    enforcement: str = "hard",
    name: str = "send_message",
) -> Limit:
    return Limit(name, maximum=maximum, period=period, window=window, enforcement=enforcement)  # type: ignore[arg-type]


def decide(
    limit: Limit, state: CounterState, window: Window, now: int, cost: int = 1
) -> EventVerdict:
    key = CounterKey(limit.name, SUBJECT, window[0], window[1])
    return decide_event([ChargeInput(limit, key, state, cost)], now)


class Counters:
    """A tiny in-memory store of first-use windows: what the storage layer does."""

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.windows: dict[Window, CounterState] = {}

    def window_for(self, now: int) -> Window:
        before = [w for w in self.windows if w[0] <= now]
        after = [w for w in self.windows if w[0] > now]
        latest = max(before) if before else None
        return first_use_window(self.limit.parsed_period, now, latest, min(after, default=None))

    def consume(self, now: int, cost: int = 1) -> EventVerdict:
        window = self.window_for(now)
        state = self.windows.get(window, CounterState())
        verdict = decide(self.limit, state, window, now, cost)
        self.windows[window] = verdict.new_states[0]
        return verdict


# --------------------------------------------------------------------------- inclusive maximum


def test_maximum_is_inclusive_five_allowed_and_the_sixth_denied(clock: FrozenClock) -> None:
    limit = fixed(maximum=5, period="2m")
    start = to_us(clock())
    window = (start, start + 120 * SECOND)
    state = CounterState()
    for n in range(1, 6):
        verdict = decide(limit, state, window, to_us(clock.advance(seconds=1)))
        assert verdict.outcome == "allowed", n
        (charge,) = verdict.charges
        assert (charge.allowed, charge.used, charge.remaining) == (True, n, 5 - n)
        state = verdict.new_states[0]
        assert state.used == n

    sixth_at = to_us(clock.advance(seconds=1))
    verdict = decide(limit, state, window, sixth_at)
    (charge,) = verdict.charges
    assert verdict.outcome == "denied"
    assert verdict.denied_by == ("send_message",)
    assert (charge.allowed, charge.outcome, charge.used, charge.remaining) == (
        False,
        "denied",
        5,
        0,
    )
    denied_state = verdict.new_states[0]
    assert denied_state.used == 5
    assert denied_state.denied_count == 1
    assert denied_state.denied_cost == 1
    assert denied_state.first_denied_at_us == sixth_at


def test_further_denials_add_up_but_first_denied_at_is_set_once(clock: FrozenClock) -> None:
    limit = fixed(maximum=5)
    start = to_us(clock())
    window = (start, start + 120 * SECOND)
    state = CounterState(used=5)
    first = decide(limit, state, window, start + 1 * SECOND, cost=1).new_states[0]
    second = decide(limit, first, window, start + 2 * SECOND, cost=3).new_states[0]
    third = decide(limit, second, window, start + 3 * SECOND, cost=2).new_states[0]
    assert third.used == 5
    assert third.denied_count == 3
    assert third.denied_cost == 6
    assert third.first_denied_at_us == start + 1 * SECOND


def test_a_cost_that_exactly_fills_the_window_is_allowed_and_one_more_is_not() -> None:
    limit = fixed(maximum=5)
    window = (0, 120 * SECOND)
    filled = decide(limit, CounterState(used=3), window, SECOND, cost=2)
    assert filled.outcome == "allowed"
    assert filled.new_states[0].used == 5
    assert filled.charges[0].remaining == 0
    over = decide(limit, CounterState(used=4), window, SECOND, cost=2)
    assert over.outcome == "denied"
    assert over.new_states[0].used == 4
    assert over.charges[0].remaining == 1


def test_resets_at_is_the_end_of_the_window_allowed_or_denied() -> None:
    limit = fixed(maximum=1)
    window = (10 * SECOND, 130 * SECOND)
    allowed = decide(limit, CounterState(), window, 11 * SECOND)
    denied = decide(limit, allowed.new_states[0], window, 12 * SECOND)
    assert allowed.charges[0].resets_at == from_us(130 * SECOND)
    assert denied.charges[0].resets_at == from_us(130 * SECOND)
    assert allowed.charges[0].window_start == from_us(10 * SECOND)


def test_evaluate_window_reports_figures_before_and_after() -> None:
    limit = fixed(maximum=5)
    ev = evaluate_window(limit, CounterState(used=2), 2, (0, 120 * SECOND), SECOND)
    assert ev.fits
    assert (ev.used_before, ev.used_after) == (2, 4)
    assert (ev.remaining_before, ev.remaining_after) == (3, 1)
    assert ev.resets_at_us == ev.resets_at_before_us == 120 * SECOND
    assert ev.retry_at_us is None
    assert ev.overage_after == 0
    assert ev.applied.used == 4
    assert ev.denied.denied_count == 1


# --------------------------------------------------------------------------- denials and retry


def test_a_denial_can_be_retried_at_the_end_of_the_window() -> None:
    limit = fixed(maximum=5)
    window = (0, 120 * SECOND)
    verdict = decide(limit, CounterState(used=5), window, 30 * SECOND)
    assert verdict.charges[0].retry_at == from_us(120 * SECOND)


def test_a_cost_larger_than_maximum_is_denied_and_never_retried() -> None:
    limit = fixed(maximum=5)
    window = (0, 120 * SECOND)
    verdict = decide(limit, CounterState(), window, SECOND, cost=6)
    (charge,) = verdict.charges
    assert verdict.outcome == "denied"
    assert charge.allowed is False
    assert charge.retry_at is None
    assert verdict.new_states[0].used == 0
    assert verdict.new_states[0].denied_cost == 6


def test_the_cost_equal_to_maximum_on_an_empty_window_is_allowed() -> None:
    verdict = decide(fixed(maximum=5), CounterState(), (0, 120 * SECOND), SECOND, cost=5)
    assert verdict.outcome == "allowed"
    assert verdict.new_states[0].used == 5


def test_at_retry_at_the_denied_cost_fits_in_the_next_first_use_window(clock: FrozenClock) -> None:
    counters = Counters(fixed(maximum=2, period="2m"))
    t0 = to_us(clock())
    counters.consume(t0, cost=2)
    denied = counters.consume(t0 + 10 * SECOND, cost=2)
    retry_at = denied.charges[0].retry_at
    assert retry_at is not None
    assert counters.consume(to_us(retry_at) - 1, cost=2).outcome == "denied"
    assert counters.consume(to_us(retry_at), cost=2).outcome == "allowed"


# --------------------------------------------------------------------------- first-use reset


def test_first_use_window_opens_at_the_first_event_and_lasts_one_period(now_us: int) -> None:
    assert first_use_window(parse_period("2m"), now_us, None, None) == (
        now_us,
        now_us + 120 * SECOND,
    )


def test_first_use_window_one_microsecond_before_the_end_is_still_inside(now_us: int) -> None:
    current = (now_us, now_us + 120 * SECOND)
    end = current[1]
    assert first_use_window(parse_period("2m"), end - 1, current, None) == current


def test_first_use_window_an_event_exactly_at_the_end_opens_a_new_window(now_us: int) -> None:
    current = (now_us, now_us + 120 * SECOND)
    end = current[1]
    assert first_use_window(parse_period("2m"), end, current, None) == (end, end + 120 * SECOND)


def test_first_use_window_after_a_gap_opens_at_the_event_not_at_the_old_end(now_us: int) -> None:
    current = (now_us, now_us + 120 * SECOND)
    later = now_us + 1000 * SECOND
    assert first_use_window(parse_period("2m"), later, current, None) == (
        later,
        later + 120 * SECOND,
    )


def test_a_full_window_resets_when_the_next_window_opens(clock: FrozenClock) -> None:
    counters = Counters(fixed(maximum=5, period="2m"))
    t0 = to_us(clock())
    for _ in range(5):
        assert counters.consume(t0).outcome == "allowed"
    assert counters.consume(t0 + 120 * SECOND - 1).outcome == "denied"
    reopened = counters.consume(t0 + 120 * SECOND)
    assert reopened.outcome == "allowed"
    assert reopened.charges[0].used == 1
    assert reopened.charges[0].window_start == from_us(t0 + 120 * SECOND)
    assert reopened.charges[0].resets_at == from_us(t0 + 240 * SECOND)
    # The old window keeps its figures, denial included.
    old = counters.windows[(t0, t0 + 120 * SECOND)]
    assert (old.used, old.denied_count) == (5, 1)


def test_a_late_event_whose_window_would_overlap_the_next_is_charged_to_it(now_us: int) -> None:
    following = (now_us, now_us + 120 * SECOND)
    late = now_us - 30 * SECOND
    assert first_use_window(parse_period("2m"), late, None, following) == following


def test_a_late_event_after_an_old_window_is_charged_to_the_next_one(now_us: int) -> None:
    old = (now_us - 1000 * SECOND, now_us - 880 * SECOND)
    following = (now_us + 60 * SECOND, now_us + 180 * SECOND)
    assert first_use_window(parse_period("2m"), now_us, old, following) == following


def test_a_late_event_opens_a_whole_window_that_ends_where_the_next_starts(now_us: int) -> None:
    following = (now_us + 120 * SECOND, now_us + 240 * SECOND)
    window = first_use_window(parse_period("2m"), now_us, None, following)
    assert window == (now_us, now_us + 120 * SECOND)


def test_first_use_window_ignores_a_next_window_further_than_a_period(now_us: int) -> None:
    following = (now_us + 500 * SECOND, now_us + 620 * SECOND)
    window = first_use_window(parse_period("2m"), now_us, None, following)
    assert window == (now_us, now_us + 120 * SECOND)


def test_a_late_event_cannot_double_the_allowance(now_us: int) -> None:
    counters = Counters(fixed(maximum=2, period="2m"))
    counters.consume(now_us, cost=2)
    late = counters.consume(now_us - 30 * SECOND, cost=2)
    assert late.outcome == "denied"
    assert late.charges[0].window_start == from_us(now_us)
    assert list(counters.windows) == [(now_us, now_us + 120 * SECOND)]


# --------------------------------------------------------------------------- calendar windows


@pytest.mark.parametrize(
    ("period", "instant", "expected"),
    [
        (
            "30s",
            (2026, 11, 22, 12, 34, 56),
            window_at(2026, 11, 22, 12, 34, 30, end=(2026, 11, 22, 12, 35)),
        ),
        (
            "1m",
            (2026, 11, 22, 12, 34, 56),
            window_at(2026, 11, 22, 12, 34, end=(2026, 11, 22, 12, 35)),
        ),
        ("1h", (2026, 11, 22, 12, 34, 56), window_at(2026, 11, 22, 12, end=(2026, 11, 22, 13))),
        ("1h", (2026, 11, 22, 23, 59, 59), window_at(2026, 11, 22, 23, end=(2026, 11, 23))),
        ("1d", (2026, 11, 22, 12, 34, 56), window_at(2026, 11, 22, end=(2026, 11, 23))),
        ("1d", (2026, 12, 31, 23, 0, 0), window_at(2026, 12, 31, end=(2027, 1, 1))),
        # 2026-11-22 is a Sunday: its week started on Monday 2026-11-16.
        ("7d", (2026, 11, 22, 12, 0, 0), window_at(2026, 11, 16, end=(2026, 11, 23))),
        ("1w", (2026, 11, 16, 0, 0, 0), window_at(2026, 11, 16, end=(2026, 11, 23))),
        ("7d", (2026, 11, 23, 0, 0, 0), window_at(2026, 11, 23, end=(2026, 11, 30))),
    ],
)
def test_calendar_windows_in_seconds_are_aligned_in_utc(
    period: str, instant: tuple[int, ...], expected: Window
) -> None:
    assert calendar_window(parse_period(period), at(*instant)) == expected


def test_calendar_week_starts_on_monday() -> None:
    start, end = calendar_window(parse_period("7d"), at(2027, 3, 17, 9))
    assert from_us(start).weekday() == 0
    assert from_us(start).time() == datetime.min.time()
    assert end - start == 7 * 86_400 * SECOND


def test_calendar_day_is_aligned_to_utc_midnight_not_local_midnight() -> None:
    # 01:30 at +02:00 is 23:30 UTC on the previous day.
    instant = to_us(datetime(2026, 11, 22, 1, 30, tzinfo=timezone(timedelta(hours=2))))
    assert calendar_window(parse_period("1d"), instant) == window_at(
        2026, 11, 21, end=(2026, 11, 22)
    )


@pytest.mark.parametrize(
    ("instant", "expected", "days"),
    [
        # a 31-day month
        ((2027, 1, 15, 8), window_at(2027, 1, 1, end=(2027, 2, 1)), 31),
        # a 30-day month
        ((2026, 11, 22, 12), window_at(2026, 11, 1, end=(2026, 12, 1)), 30),
        # February in a leap year
        ((2028, 2, 29, 23, 59, 59), window_at(2028, 2, 1, end=(2028, 3, 1)), 29),
        # February in a common year
        ((2027, 2, 14, 0), window_at(2027, 2, 1, end=(2027, 3, 1)), 28),
        # December rolls over into January of the next year
        ((2026, 12, 31, 23, 59, 59), window_at(2026, 12, 1, end=(2027, 1, 1)), 31),
    ],
)
def test_calendar_month_windows_follow_the_calendar(
    instant: tuple[int, ...], expected: Window, days: int
) -> None:
    window = calendar_window(parse_period("1mo"), at(*instant))
    assert window == expected
    assert window[1] - window[0] == days * 86_400 * SECOND


def test_calendar_month_last_microsecond_and_first_of_next_month() -> None:
    period = parse_period("1mo")
    march = at(2027, 3, 1)
    assert calendar_window(period, march - 1) == window_at(2027, 2, 1, end=(2027, 3, 1))
    assert calendar_window(period, march) == window_at(2027, 3, 1, end=(2027, 4, 1))


def test_a_month_window_found_again_is_the_window_of_the_instant_asked() -> None:
    """The last window of months is remembered: asked in any order, across
    both ends of a window, each answer is the one worked out afresh."""
    period = parse_period("1mo")
    march, april = at(2027, 3, 1), at(2027, 4, 1)
    for instant in (march, april - 1, march - 1, april, march, april - 1, april + 1, march):
        assert calendar_window(period, instant) == _months_window(period, instant)
    assert calendar_window(period, april - 1) == (march, april)


@pytest.mark.parametrize(
    ("instant", "expected"),
    [
        ((2027, 2, 15), window_at(2027, 1, 1, end=(2027, 4, 1))),
        ((2027, 4, 1), window_at(2027, 4, 1, end=(2027, 7, 1))),
        ((2027, 9, 30, 23, 59, 59), window_at(2027, 7, 1, end=(2027, 10, 1))),
        ((2026, 11, 22, 12), window_at(2026, 10, 1, end=(2027, 1, 1))),
    ],
)
def test_calendar_three_months_are_quarters(instant: tuple[int, ...], expected: Window) -> None:
    assert calendar_window(parse_period("3mo"), at(*instant)) == expected


def test_calendar_year_is_the_calendar_year() -> None:
    assert calendar_window(parse_period("1y"), at(2028, 7, 4)) == window_at(
        2028, 1, 1, end=(2029, 1, 1)
    )


PERIODS = ["30s", "1m", "45m", "1h", "1d", "7d", "1mo", "3mo", "1y"]


@settings(max_examples=200, deadline=None)
@given(
    period=st.sampled_from(PERIODS),
    instant=st.integers(min_value=at(1990, 1, 1), max_value=at(2100, 1, 1)),
)
def test_calendar_windows_contain_the_instant_and_tile_time(period: str, instant: int) -> None:
    parsed = parse_period(period)
    start, end = calendar_window(parsed, instant)
    assert start <= instant < end
    assert calendar_window(parsed, start) == (start, end)
    assert calendar_window(parsed, end - 1) == (start, end)
    assert calendar_window(parsed, end)[0] == end


# --------------------------------------------------------------------------- first-use months


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ((2027, 1, 31, 10), (2027, 2, 28, 10)),
        ((2028, 1, 31, 10), (2028, 2, 29, 10)),
        ((2027, 3, 31, 0), (2027, 4, 30, 0)),
        ((2026, 12, 15, 12), (2027, 1, 15, 12)),
        ((2026, 11, 22, 12), (2026, 12, 22, 12)),
    ],
)
def test_first_use_month_ends_on_the_same_day_or_the_last_day_of_a_shorter_month(
    start: tuple[int, ...], end: tuple[int, ...]
) -> None:
    assert first_use_window(parse_period("1mo"), at(*start), None, None) == (at(*start), at(*end))


def test_first_use_month_keeps_the_time_of_day_to_the_microsecond() -> None:
    start = at(2027, 1, 31, 10, 11, 12) + 345_678
    assert add_period(start, parse_period("1mo")) == at(2027, 2, 28, 10, 11, 12) + 345_678


def test_first_use_year_from_february_29_ends_on_february_28() -> None:
    assert add_period(at(2028, 2, 29, 6), parse_period("1y")) == at(2029, 2, 28, 6)


def test_first_use_and_calendar_windows_differ_for_the_same_instants() -> None:
    first, second = at(2026, 11, 22, 12), at(2026, 12, 5, 9)
    period = parse_period("1mo")
    # Calendar: two billing months, two windows.
    assert calendar_window(period, first) == window_at(2026, 11, 1, end=(2026, 12, 1))
    assert calendar_window(period, second) == window_at(2026, 12, 1, end=(2027, 1, 1))
    # First use: the window opened on Nov 22 still holds Dec 5.
    opened = first_use_window(period, first, None, None)
    assert opened == (first, at(2026, 12, 22, 12))
    assert first_use_window(period, second, opened, None) == opened


def test_first_use_and_calendar_limits_give_different_verdicts() -> None:
    first_use = fixed(maximum=1, period="1d", name="daily")
    calendar = fixed(maximum=1, period="1d", window="calendar", name="daily")
    evening = at(2026, 11, 22, 23)
    morning = at(2026, 11, 23, 1)

    counters = Counters(first_use)
    counters.consume(evening)
    assert counters.consume(morning).outcome == "denied"

    window = calendar_window(calendar.parsed_period, evening)
    assert decide(calendar, CounterState(), window, evening).outcome == "allowed"
    next_window = calendar_window(calendar.parsed_period, morning)
    assert next_window != window
    assert decide(calendar, CounterState(), next_window, morning).outcome == "allowed"


# --------------------------------------------------------------------------- soft enforcement


def test_soft_limit_always_allows_and_reports_overage_past_maximum() -> None:
    limit = fixed(maximum=5, enforcement="soft")
    window = (0, 120 * SECOND)
    state = CounterState()
    outcomes = []
    for n in range(1, 9):
        verdict = decide(limit, state, window, n * SECOND)
        (charge,) = verdict.charges
        assert charge.allowed
        assert charge.used == n
        assert charge.overage == max(n - 5, 0)
        assert charge.remaining == max(5 - n, 0)
        assert charge.retry_at is None
        state = verdict.new_states[0]
        outcomes.append(verdict.outcome)
    assert outcomes == ["allowed"] * 5 + ["overage"] * 3
    assert state.used == 8
    assert state.denied_count == 0
    assert state.denied_cost == 0


def test_soft_limit_allows_a_cost_larger_than_maximum_as_overage() -> None:
    limit = fixed(maximum=5, enforcement="soft")
    verdict = decide(limit, CounterState(used=4), (0, 120 * SECOND), SECOND, cost=10)
    (charge,) = verdict.charges
    assert verdict.outcome == "overage"
    assert verdict.denied_by == ()
    assert (charge.outcome, charge.used, charge.overage, charge.remaining) == (
        "overage",
        14,
        9,
        0,
    )
    assert verdict.new_states[0].used == 14


def test_soft_limit_reaching_exactly_maximum_is_allowed_without_overage() -> None:
    limit = fixed(maximum=5, enforcement="soft")
    verdict = decide(limit, CounterState(used=3), (0, 120 * SECOND), SECOND, cost=2)
    assert verdict.outcome == "allowed"
    assert verdict.charges[0].overage == 0


# -- a window topped up by grants (`grants.fit_window` through `evaluate_window`) --

W_START = at(2026, 11, 1)
W_END = at(2026, 12, 1)
W_NOW = at(2026, 11, 20)
MONTHLY = Limit("calls", maximum=10, period="1mo", window="calendar")
MONTHLY_SOFT = Limit("calls", maximum=10, period="1mo", window="calendar", enforcement="soft")


def topped_up(granted: int = 2) -> Pot:
    """3 left of a grant that expires one microsecond after W_NOW, 2 of one that never does."""
    pot = Pot([Balance("g2", 2, 0, 0, None), Balance("g1", 4, 1, 0, W_NOW + 1)])
    if granted:
        pot.granted[W_START] = granted
        pot.granted[W_END] = 99  # the next window's: not this one's
    return pot


def test_a_granted_window_fits_what_its_own_room_and_active_grants_hold() -> None:
    # used 7, of which 2 paid by grants: own usage 5, own room 5, grants 3 + 2
    state = CounterState(used=7, denied_count=1, denied_cost=4, first_denied_at_us=W_START)
    window = (W_START, W_END)
    assert evaluate_window(MONTHLY, state, 6, window, W_NOW, topped_up()) == Evaluation(
        fits=True,
        applied=CounterState(used=13, denied_count=1, denied_cost=4, first_denied_at_us=W_START),
        denied=CounterState(used=7, denied_count=2, denied_cost=10, first_denied_at_us=W_START),
        used_before=7,
        used_after=13,
        remaining_before=10,
        remaining_after=4,
        resets_at_us=W_END,
        resets_at_before_us=W_END,
        retry_at_us=None,
        overage_after=0,
        overage_before=0,
        draws=(("g1", 1),),
    )
    whole = evaluate_window(MONTHLY, state, 10, window, W_NOW, topped_up())
    assert (whole.fits, whole.remaining_after, whole.draws) == (True, 0, (("g1", 3), ("g2", 2)))
    one_more = evaluate_window(MONTHLY, state, 11, window, W_NOW, topped_up())
    # The next window holds 10 of its own and the 2 of g2, which never expires.
    assert (one_more.fits, one_more.draws, one_more.retry_at_us) == (False, (), W_END)
    never = evaluate_window(MONTHLY, state, 13, window, W_NOW, topped_up())
    assert (never.fits, never.retry_at_us) == (False, None)


def test_a_granted_window_without_draws_yet_counts_all_its_usage_as_its_own() -> None:
    state = CounterState(used=7)
    window = (W_START, W_END)
    # own room 3, grants 5 (an absent window counts 0 granted, whatever the next holds)
    pot = topped_up(granted=0)
    pot.granted[W_END] = 4
    fit = evaluate_window(MONTHLY, state, 8, window, W_NOW, pot)
    assert (fit.fits, fit.remaining_before, fit.remaining_after) == (True, 8, 0)
    assert fit.draws == (("g1", 3), ("g2", 2))
    denied = evaluate_window(MONTHLY, state, 9, window, W_NOW, topped_up(granted=0))
    assert (denied.fits, denied.draws, denied.retry_at_us) == (False, (), W_END)
    assert denied.overage_after == 6 and denied.overage_before == 0
    whole = evaluate_window(MONTHLY, state, 10, window, W_NOW, topped_up(granted=0))
    assert (whole.fits, whole.retry_at_us) == (False, W_END)  # the maximum fits a fresh window


def test_a_grant_expired_at_the_events_time_tops_nothing_up() -> None:
    state = CounterState(used=7)
    window = (W_START, W_END)
    late = evaluate_window(MONTHLY, state, 5, window, W_NOW + 1, topped_up(granted=0))
    assert (late.fits, late.remaining_before, late.draws) == (True, 5, (("g2", 2),))
    assert late.remaining_after == 0
    too_late = evaluate_window(MONTHLY, state, 6, window, W_NOW + 1, topped_up(granted=0))
    assert (too_late.fits, too_late.retry_at_us, too_late.remaining_after) == (False, W_END, 0)


def test_a_soft_granted_window_draws_every_grant_and_reports_the_rest_as_overage() -> None:
    # used 12 of which 1 granted: own usage 11, one past the maximum already
    state = CounterState(used=12)
    window = (W_START, W_END)
    assert evaluate_window(MONTHLY_SOFT, state, 7, window, W_NOW, topped_up(granted=1)) == (
        Evaluation(
            fits=True,
            applied=CounterState(used=19),
            denied=CounterState(used=12, denied_count=1, denied_cost=7, first_denied_at_us=W_NOW),
            used_before=12,
            used_after=19,
            remaining_before=5,
            remaining_after=0,
            resets_at_us=W_END,
            resets_at_before_us=W_END,
            retry_at_us=None,
            overage_after=3,
            overage_before=1,
            draws=(("g1", 3), ("g2", 2)),
        )
    )


def test_a_late_event_in_the_gap_between_two_windows_is_charged_to_the_next_one() -> None:
    counters = Counters(fixed(maximum=2, period="1mo"))
    march = counters.consume(at(2027, 3, 1))
    april = counters.consume(at(2027, 4, 1, second=1))
    assert march.charges[0].resets_at == from_us(at(2027, 4, 1))
    assert april.charges[0].window_start == from_us(at(2027, 4, 1, second=1))
    late = counters.consume(at(2027, 4, 1), cost=2)
    # The gap [Apr 1 00:00:00, 00:00:01) holds no maximum of its own.
    assert late.outcome == "denied"
    assert late.charges[0].window_start == from_us(at(2027, 4, 1, second=1))
    assert late.charges[0].used == 1
    fitting = counters.consume(at(2027, 4, 1))
    assert fitting.outcome == "allowed"
    assert fitting.charges[0].used == 2
    assert sorted(counters.windows) == [
        window_at(2027, 3, 1, end=(2027, 4, 1)),
        window_at(2027, 4, 1, 0, 0, 1, end=(2027, 5, 1, 0, 0, 1)),
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 600), min_size=1, max_size=12))
def test_in_any_arrival_order_windows_last_a_whole_period_and_never_overlap(
    seconds: list[int],
) -> None:
    counters = Counters(fixed(maximum=2, period="2m"))
    for second in seconds:
        counters.consume(second * SECOND)
    windows = sorted(counters.windows)
    # No gap between windows holds a window (and a maximum) of its own.
    assert all(end - start == 120 * SECOND for start, end in windows)
    assert all(a[1] <= b[0] for a, b in pairwise(windows))


def test_a_window_of_months_may_start_in_the_year_before() -> None:
    january = to_us(datetime(2026, 1, 15, tzinfo=UTC))
    assert calendar_window(parse_period("5mo"), january) == (
        to_us(datetime(2025, 11, 1, tzinfo=UTC)),
        to_us(datetime(2026, 4, 1, tzinfo=UTC)),
    )


def test_a_month_window_is_computed_with_nothing_remembered_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (a new process: no month window of the period computed before)
    monkeypatch.setattr(windows, "_LAST_MONTHS", {})
    month = parse_period("1mo")
    march = (at(2026, 3, 1), at(2026, 4, 1))
    assert calendar_window(month, at(2026, 3, 15)) == march
    assert calendar_window(month, at(2026, 3, 31, 23)) == march
    assert calendar_window(month, at(2026, 4, 1)) == (at(2026, 4, 1), at(2026, 5, 1))
