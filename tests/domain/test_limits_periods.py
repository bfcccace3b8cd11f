"""A period's length limits, which mutation testing found unasserted: at most
32 characters and ten years, and leading zeros are no digits.
"""

from __future__ import annotations

import pytest

from metering.domain.limits import MAX_PERIOD_CHARS, Period, parse_period
from metering.errors import InvalidLimit


def test_a_period_is_at_most_32_characters_and_ten_years() -> None:
    padded = "1d".ljust(MAX_PERIOD_CHARS)
    assert parse_period(padded) == Period(seconds=86_400)
    with pytest.raises(InvalidLimit, match="longer than 32 characters"):
        parse_period(padded + " ")
    assert parse_period("3653d") == Period(seconds=3653 * 86_400)
    assert parse_period("120mo") == Period(months=120)


def test_leading_zeros_of_a_period_do_not_count_as_digits() -> None:
    assert parse_period("0000000000000001s") == Period(seconds=1)
