"""The runaway breaker's rule on a frozen stream: a steady subject never
trips; a synthetic burst past the multiple trips a minute after the rate
first ran past it; a subject younger than a day trips only under a floor."""

from __future__ import annotations

import math

import pytest

from metering.domain.breaker import (
    BASELINE_TAU_SECONDS,
    SUSTAIN_US,
    Baseline,
    baseline_added,
    parse_factor,
    step,
)
from metering.domain.forecast import added
from metering.errors import InvalidLimit

MINUTE_US = 60_000_000


@pytest.mark.parametrize(("text", "factor"), [("10x", 10), (" 3X ", 3), ("1000x", 1000)])
def test_a_factor_is_a_multiple(text: str, factor: int) -> None:
    assert parse_factor(text) == factor


@pytest.mark.parametrize("text", ["1x", "x", "10", 10, "1001x", "2.5x", None])
def test_a_bad_factor_names_the_breaker(text: object) -> None:
    with pytest.raises(InvalidLimit, match="breaker"):
        parse_factor(text)


def test_the_baseline_decays_over_a_day() -> None:
    first = baseline_added(None, 86_400, 0)
    assert (first.rate, first.since_us) == (1.0, 0)
    later = baseline_added(first, 0, BASELINE_TAU_SECONDS * 1_000_000)
    assert later.rate == pytest.approx(1 / math.e, rel=1e-6)


State = tuple[Baseline | None, float, int]  # the baseline, the counter's rate and its instant


def _run(
    minutes: int, per_minute: int, start_us: int, state: State
) -> tuple[State, Baseline | None]:
    """``minutes`` charges of ``per_minute`` units, a minute apart: the state
    after them, and the baseline when the breaker first tripped (None: never)."""
    baseline, rate, rate_at = state
    tripped = None
    for n in range(minutes):
        now = start_us + n * MINUTE_US
        rate, rate_at = added(rate, rate_at, per_minute, now)
        baseline, trips = step(baseline, rate, per_minute, now, factor=10)
        if trips and tripped is None:
            tripped = baseline
    return (baseline, rate, rate_at), tripped


def test_a_steady_subject_never_trips_and_a_burst_does_after_a_minute() -> None:
    state, tripped = _run(3 * 24 * 60, 60, 0, (None, 0.0, 0))  # a unit a second, 3 days
    assert tripped is None
    baseline = state[0]
    assert baseline is not None and baseline.rate == pytest.approx(1.0, rel=0.05)
    burst_start = 3 * 24 * 60 * MINUTE_US
    _, tripped = _run(6 * 60, 100 * 60, burst_start, state)  # 100 a second
    assert tripped is not None and tripped.over_since_us is not None
    # The counter's rate (an hour's) ran past 10 x 1 a second some minutes in;
    # the breaker tripped at the first charge a minute after that.
    assert tripped.over_since_us > burst_start
    assert tripped.rate_at_us - tripped.over_since_us == SUSTAIN_US


def test_a_young_subject_trips_only_under_a_floor() -> None:
    rate, baseline = 0.0, None
    for n in range(10):  # 50 a second from the first charge
        now = n * MINUTE_US
        rate, _ = added(rate, 0 if n == 0 else (n - 1) * MINUTE_US, 3_000, now)
        baseline, trips = step(baseline, rate, 3_000, now, factor=10)
        assert not trips
    floored, trips = None, False
    rate, at = 0.0, 0
    for n in range(10):
        now = n * MINUTE_US
        rate, at = added(rate, at, 3_000, now)
        floored, trips = step(floored, rate, 3_000, now, factor=10, floor=0.1)
    assert trips  # past 10 x 0.1 a second for over a minute
