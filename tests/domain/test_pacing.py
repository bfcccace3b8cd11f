"""Pacing: the paced maximum, when a denial is back on pace, and the limits that may be paced."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.domain.limits import Limit
from metering.domain.pacing import (
    back_on_pace_us,
    burst_units,
    paced_maximum,
    paced_retry_us,
    parse_burst,
)
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


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"period": "10s", "algorithm": "token_bucket", "pacing": True}, "pacing"),
        ({"algorithm": "concurrent", "pacing": True}, "pacing"),
        ({"period": "1h", "aggregation": "max", "pacing": True}, "pacing"),
        ({"period": "1h", "burst": 2}, "burst"),
        ({"period": "1h", "pacing": True, "burst": 11}, "burst"),
        ({"period": "1h", "pacing": "yes"}, "pacing"),
    ],
)
def test_what_cannot_be_paced_is_refused(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidLimit) as raised:
        Limit("x", maximum=10, **options)  # type: ignore[arg-type]
    assert raised.value.field == field
