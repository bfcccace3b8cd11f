"""Per-subject alert thresholds (`metering.domain.alerts`): ``--at`` points are
percentages and amounts, each within its bounds, and a bad one says why."""

from __future__ import annotations

import pytest

from metering.domain.alerts import parse_points, shown_points
from metering.errors import InvalidInput


def test_alert_points_are_percentages_and_amounts() -> None:
    assert parse_points(["80%", "5000", 90, "50 %"]) == ((50, 80), (90, 5000))
    assert shown_points((50, 80), (90,)) == ["50%", "80%", "90"]
    assert parse_points("80%") == ((80,), ())
    for bad in ([], ["0%"], ["1001%"], [0], [True], ["x"], [None], ["10" * 10]):
        with pytest.raises(InvalidInput):
            parse_points(bad)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([], "give at least one threshold, such as 80% or 5000"),
        ([True], "True is not a threshold"),
        ([0], "0 must be between 1 and 1000000000000000"),
        ([10**15 + 1], "1000000000000001 must be between 1 and 1000000000000000"),
        ([2.5], "2.5 is not a threshold such as 80% or 5000"),
        (["x%"], "'x%' is not a threshold such as 80% or 5000"),
        (["1" * 16], "'1111111111111111' must be between 1 and 1000000000000000"),
        (["1" * 17], "'11111111111111111' is not a threshold such as 80% or 5000"),
        (["0"], "'0' must be between 1 and 1000000000000000"),
        (["1001%"], "'1001%' must be between 1 and 1000"),
        (["0%"], "'0%' must be between 1 and 1000"),
        ([f"{p}%" for p in range(1, 18)], "at most 16 percentages and amounts each"),
        (list(range(1, 18)), "at most 16 percentages and amounts each"),
    ],
)
def test_bad_alert_points_say_why(values: list[object], message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_points(values)
    assert (raised.value.field, str(raised.value)) == ("at", f"at: {message}")


def test_alert_points_at_their_bounds() -> None:
    assert parse_points([1, "1%", "1000%", 10**15, str(10**15)]) == ((1, 1000), (1, 10**15))
    sixteen = [f"{p}%" for p in range(1, 17)] + list(range(1, 17))
    assert parse_points(sixteen) == (tuple(range(1, 17)), tuple(range(1, 17)))
