"""Pacing: the paced maximum, when a denial is back on pace, and the limits that may be paced."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_rules import MONTH, SECOND, Engines, both_engines, random_stream

from metering.domain.limits import Limit
from metering.domain.pacing import (
    ahead_of_pace,
    back_on_pace_us,
    burst_units,
    paced_maximum,
    paced_retry_us,
    parse_burst,
)
from metering.domain.state import CounterState
from metering.errors import InvalidLimit

DAY = 86_400_000_000
NOVEMBER = (0, 30 * DAY)

maxima = st.integers(1, 10**12)
bursts = st.one_of(st.integers(0, 10**6), st.integers(0, 100).map(lambda p: f"{p}%"))
windows = st.tuples(st.integers(0, 10**15), st.integers(1, 10**13)).map(
    lambda w: (w[0], w[0] + w[1])
)


def test_a_month_paces_a_thirtieth_a_day_plus_the_burst() -> None:
    assert paced_maximum(3000, "5%", NOVEMBER, 0) == 150
    assert paced_maximum(3000, "5%", NOVEMBER, 3 * DAY) == 450
    assert paced_maximum(3000, 0, NOVEMBER, 10 * DAY) == 1000
    assert paced_maximum(3000, "5%", NOVEMBER, 30 * DAY - 1) == 3000  # capped
    # 151 fits once 1 unit more is paced: 864 s in (30 days / 3,000).
    assert back_on_pace_us(3000, "5%", NOVEMBER, 151) == 864_000_000
    assert back_on_pace_us(3000, "5%", NOVEMBER, 150) == 0
    assert back_on_pace_us(3000, "5%", NOVEMBER, 3001) is None


@given(maximum=maxima, burst=bursts, window=windows, at=st.integers(0, 10**13))
def test_the_pace_grows_with_time_and_never_passes_the_maximum(
    maximum: int, burst: int | str, window: tuple[int, int], at: int
) -> None:
    if isinstance(burst, int):
        burst = min(burst, maximum)
    now = window[0] + at
    paced = paced_maximum(maximum, burst, window, now)
    assert burst_units(burst, maximum) <= paced or paced == maximum
    assert paced <= maximum
    assert paced <= paced_maximum(maximum, burst, window, now + 1)
    assert paced_maximum(maximum, burst, window, window[1]) == maximum


@given(maximum=maxima, burst=bursts, window=windows, used=st.integers(0, 10**12))
def test_back_on_pace_is_the_first_instant_that_fits(
    maximum: int, burst: int | str, window: tuple[int, int], used: int
) -> None:
    at = back_on_pace_us(maximum, burst, window, used)
    if at is None:
        assert used > maximum or paced_maximum(maximum, burst, window, window[1] - 1) < used
        return
    assert window[0] <= at < window[1]
    assert paced_maximum(maximum, burst, window, at) >= used
    if at > window[0]:
        assert paced_maximum(maximum, burst, window, at - 1) < used


def test_a_retry_is_only_later_in_the_window() -> None:
    assert paced_retry_us(3000, "5%", NOVEMBER, 151, 0) == 864_000_000
    assert paced_retry_us(3000, "5%", NOVEMBER, 150, 5) is None  # fits now: not pacing's denial
    assert paced_retry_us(3000, "5%", NOVEMBER, 3001, 0) is None  # the next window's


@pytest.mark.parametrize(
    ("given_burst", "expected"),
    [(0, 0), ("12", 12), (" 7% ", "7%"), ("100%", "100%"), ("05%", "5%")],
)
def test_a_burst_is_units_or_a_percentage(given_burst: object, expected: object) -> None:
    assert parse_burst(given_burst, 100) == expected


@pytest.mark.parametrize("bad", [-1, 101, "101%", "5.5%", "x", True, 2.5, None, "%"])
def test_a_bad_burst_is_refused(bad: object) -> None:
    with pytest.raises(InvalidLimit) as raised:
        parse_burst(bad, 100)
    assert raised.value.field == "burst"


def test_a_paced_limit_has_the_default_burst_and_says_so() -> None:
    limit = Limit("budget", maximum=3000, period="1mo", window="calendar", pacing=True)
    assert limit.burst == "5%"
    assert limit.to_dict()["pacing"] is True and limit.to_dict()["burst"] == "5%"
    assert "pacing" not in Limit("plain", maximum=3, period="1h").to_dict()
    assert Limit.from_dict({**limit.to_dict(), "burst": 30}) == Limit(
        "budget", maximum=3000, period="1mo", window="calendar", pacing=True, burst=30
    )


BUCKET_OR_LICENSES = "a bucket refills at its own pace; licenses are held"


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        (
            {"period": "10s", "algorithm": "token_bucket", "pacing": True},
            "pacing",
            BUCKET_OR_LICENSES,
        ),
        ({"algorithm": "concurrent", "pacing": True}, "pacing", BUCKET_OR_LICENSES),
        (
            {"period": "1h", "aggregation": "max", "pacing": True},
            "pacing",
            "a gauge reports a level, which is not spent over time",
        ),
        ({"period": "1h", "burst": 2}, "burst", "only a paced limit has a burst: add pacing"),
        (
            {"period": "1h", "pacing": True, "burst": 11},
            "burst",
            "must be between 0 and 10 units, got 11",
        ),
        ({"period": "1h", "pacing": "yes"}, "pacing", "must be true or false, got 'yes'"),
        ({"period": "1h", "pacing": None}, "pacing", "must be true or false, got None"),
    ],
)
def test_what_cannot_be_paced_is_refused_word_for_word(
    options: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(InvalidLimit) as raised:
        Limit("x", maximum=10, **options)  # type: ignore[arg-type]
    assert (raised.value.field, str(raised.value)) == (field, f"{field}: {message}")


# ------------------------------------------------- the hot path's pacing (`rules._paced`)

PACED = [
    Limit("paced", maximum=6, period="1h", window="calendar", pacing=True, burst=1),
    Limit(
        "paced_soft",
        maximum=8,
        period="30m",
        enforcement="soft",
        pacing=True,
        burst="25%",
        thresholds=(50,),
    ),
    Limit("paced_shadow", maximum=4, period="1h", enforcement="shadow", pacing=True, burst=0),
    Limit("paced_day", maximum=40, period="1d", window="calendar", pacing=True, burst="10%"),
    Limit("soft_0", maximum=5, period="1h", enforcement="soft", pacing=True, burst=0),
    Limit("plain", maximum=5, period="1h", window="calendar"),
]
STEPS_US = [0, 0, 1, SECOND, 60 * SECOND, 300 * SECOND, 900 * SECOND, 3600 * SECOND]


def _stream(seed: int, events: int) -> Engines:
    costs = [0, 1, 1, 2, 3, 4, 5, 6, 7, 9]  # each paced maximum, and one more
    return random_stream(PACED, seed, events, STEPS_US, lambda rng, _: rng.choice(costs))


SEEDS = range(4)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_hot_path_paces_like_decide_event(seed: int) -> None:
    """`rules.decide` against `decide_event` over paced limits (hard, soft with
    thresholds, shadow; first-use and calendar; units and percentage bursts)."""
    _stream(seed, events=200)


def test_the_paced_streams_reach_every_outcome_and_notice() -> None:
    seen: set[str] = set()
    for seed in SEEDS:
        seen |= _stream(seed, events=200).seen
    assert seen >= {
        "allowed",
        "denied",
        "overage",
        "ahead_of_pace",
        "denied by 2",
        "mark denied",
        "mark would_deny",
        "mark threshold:50",
        "mark exceeded",
        "retry never",
    }


MONTH_LENGTH = MONTH[1] - MONTH[0]
PACED_MONTH = [
    Limit("calls", maximum=10, period="1mo", window="calendar", pacing=True, burst=1),
    Limit(
        "calls",
        maximum=10,
        period="1mo",
        window="calendar",
        pacing=True,
        burst="20%",
        enforcement="soft",
        thresholds=(50, 100),
    ),
    Limit("calls", maximum=10, period="1mo", window="calendar", pacing=True, enforcement="shadow"),
]


BESIDE = Limit("other", maximum=100, period="1mo", window="calendar")


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_the_hot_path_paces_with_grants_like_decide_event(seed: int, stacked: bool) -> None:
    """A paced window with grants (`rules._paced` with a pot): the grants add to
    the pace, and overage counts own usage against the maximum; alone (an event
    of one charge) and stacked on a plain limit (`decide`'s loop over charges)."""
    rng = random.Random(seed)
    outcomes = set()
    for _ in range(150):
        limit = rng.choice(PACED_MONTH)
        at_us = MONTH[0] + rng.choice([0, 1, MONTH_LENGTH // 3, MONTH_LENGTH // 2])
        granted = rng.choice([None, 0, 0, 2, 4])
        used = rng.randint(0, 13) + (granted or 0)
        cost = rng.choice([0, 1, 2, 3, 5, 9, 10, 11, 12, 13, 16])  # the maximum, with grants
        limits, charges = [limit], [("org", "calls", cost)]
        states, pots = [CounterState(used)], [granted]
        if stacked:
            limits.append(BESIDE)
            charges.append(("org", "other", 1))
            states.append(CounterState(0))
            pots.append(None)
        rows, _, _ = both_engines(limits, charges, states, pots, at_us)
        outcomes.add(rows[0][4])
    assert outcomes >= {"allowed", "denied", "overage", "would_deny", "ahead_of_pace"}


def test_the_pace_is_whole_units_rounded_down() -> None:
    assert burst_units("5%", 30) == 1 and type(burst_units("5%", 30)) is int  # 1.5
    assert burst_units("50%", 30) == 15
    assert paced_maximum(10, 0, (0, 3), 1) == 3 and type(paced_maximum(10, 0, (0, 3), 1)) is int


def test_ahead_of_pace_is_past_the_pace_within_the_maximum() -> None:
    assert not ahead_of_pace(3000, "5%", NOVEMBER, 150, 0)  # at the pace
    assert ahead_of_pace(3000, "5%", NOVEMBER, 151, 0)
    assert ahead_of_pace(3000, "5%", NOVEMBER, 3000, 0)
    assert not ahead_of_pace(3000, "5%", NOVEMBER, 3001, 0)  # past the maximum: overage
    assert not ahead_of_pace(3000, 0, NOVEMBER, 1000, 10 * DAY)
    assert ahead_of_pace(3000, 0, NOVEMBER, 1001, 10 * DAY)


def test_a_retry_back_on_pace_now_is_no_retry() -> None:
    assert paced_retry_us(3000, "5%", NOVEMBER, 151, 864_000_000 - 1) == 864_000_000
    assert paced_retry_us(3000, "5%", NOVEMBER, 151, 864_000_000) is None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (True, "give units or a percentage like '5%', not True"),
        (101, "must be between 0 and 100 units, got 101"),
        ("5.5%", "'5.5%' is not units or a percentage from 0% to 100% like '5%'"),
        (None, "None is not units or a percentage from 0% to 100% like '5%'"),
    ],
)
def test_a_bad_burst_is_told_why(bad: object, message: str) -> None:
    with pytest.raises(InvalidLimit) as raised:
        parse_burst(bad, 100)
    assert str(raised.value) == f"burst: {message}"


def test_a_burst_may_be_the_whole_maximum() -> None:
    assert parse_burst(100, 100) == 100
    assert parse_burst("100", 100) == 100
