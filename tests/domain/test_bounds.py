"""The bounds on plain numbers (`domain/bounds.py`); those on instants are in
test_instants.py.

Each check is at the public edge: what passes must be safe to bind in SQL
or to turn into a datetime, and what fails names its argument in one line.
"""

from __future__ import annotations

from typing import Any

import pytest

from metering.domain.bounds import (
    MAX_DURATION_SECONDS,
    MAX_LISTING,
    MAX_ROW_ID,
    shown,
    validate_count,
    validate_row_id,
    validate_seconds,
    validate_whole,
)
from metering.errors import InvalidInput, InvalidLimit

# --------------------------------------------------------------------------- shown


def test_shown_is_the_repr_of_short_values() -> None:
    assert shown("abc") == "'abc'"
    assert shown(None) == "None"
    assert shown(10**18 - 1) == "999999999999999999"
    assert shown(-(10**18) + 1) == "-999999999999999999"


def test_shown_describes_an_integer_from_10_to_the_18_by_its_size() -> None:
    assert shown(10**18) == "a 60-bit integer"
    assert shown(-(10**18)) == "a 60-bit integer"
    assert shown(10**5000) == "a 16610-bit integer"


def test_shown_prints_booleans_as_booleans() -> None:
    assert shown(True) == "True"


def test_shown_cuts_text_longer_than_60_characters_with_an_ellipsis() -> None:
    exactly = "x" * 58  # 60 characters with its quotes
    assert shown(exactly) == repr(exactly)
    longer = "x" * 59
    assert shown(longer) == "'" + "x" * 58 + "…"
    assert len(shown(longer)) == 60


# --------------------------------------------------------------------------- counts, ids


@pytest.mark.parametrize("value", [1, 2, MAX_LISTING])
def test_a_count_is_a_whole_number_from_one_to_the_maximum(value: int) -> None:
    assert validate_count("count", value) == value


def test_a_count_may_have_its_own_maximum() -> None:
    assert validate_count("count", 7, maximum=7) == 7
    with pytest.raises(InvalidInput, match=r"^count: must be between 1 and 7, got 8$"):
        validate_count("count", 8, maximum=7)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be between 1 and 1,000,000, got 0"),
        (-1, "must be between 1 and 1,000,000, got -1"),
        (MAX_LISTING + 1, "must be between 1 and 1,000,000, got 1000001"),
        (True, "must be a whole number, got True"),
        (1.0, "must be a whole number, got 1.0"),
        ("5", "must be a whole number, got '5'"),
    ],
)
def test_a_count_outside_the_bounds_names_its_argument(value: object, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_count("last", value)
    assert (raised.value.field, raised.value.message) == ("last", message)


@pytest.mark.parametrize("value", [1, 2, MAX_ROW_ID])
def test_a_row_id_fits_in_a_signed_64_bit_integer(value: int) -> None:
    assert validate_row_id("id", value) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, f"must be between 1 and {MAX_ROW_ID}, got 0"),
        (MAX_ROW_ID + 1, f"must be between 1 and {MAX_ROW_ID}, got a 64-bit integer"),
        (10**30, f"must be between 1 and {MAX_ROW_ID}, got a 100-bit integer"),
        (False, "must be a whole number, got False"),
        (2.5, "must be a whole number, got 2.5"),
    ],
)
def test_a_row_id_outside_the_bounds_names_its_argument(value: object, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_row_id("message_id", value)
    assert (raised.value.field, raised.value.message) == ("message_id", message)


# --------------------------------------------------------------------------- seconds


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 30, MAX_DURATION_SECONDS])
def test_seconds_are_finite_from_zero_to_a_century(value: float) -> None:
    result = validate_seconds("grace", value)
    assert result == value and type(result) is float


def test_seconds_may_have_their_own_maximum() -> None:
    assert validate_seconds("ttl", 60, maximum=60) == 60.0
    with pytest.raises(InvalidInput, match=r"^ttl: must be from 0 to 60 seconds, got 61$"):
        validate_seconds("ttl", 61, maximum=60)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "must be from 0 to 3,162,240,000 seconds, got -1"),
        (-0.001, "must be from 0 to 3,162,240,000 seconds, got -0.001"),
        (MAX_DURATION_SECONDS + 1, "must be from 0 to 3,162,240,000 seconds, got 3162240001"),
        (float("nan"), "must be from 0 to 3,162,240,000 seconds, got nan"),
        (float("inf"), "must be from 0 to 3,162,240,000 seconds, got inf"),
        (True, "must be a number of seconds, got True"),
        ("30", "must be a number of seconds, got '30'"),
        (None, "must be a number of seconds, got None"),
    ],
)
def test_seconds_outside_the_bounds_name_their_argument(value: object, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_seconds("grace", value)
    assert (raised.value.field, raised.value.message) == ("grace", message)


def _whole_refused(
    field_name: str, value: object, low: int, high: int, **options: Any
) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        validate_whole(field_name, value, low, high, **options)
    return info.value


def test_validate_whole_bounds_both_ends_and_names_the_field() -> None:
    assert validate_whole("n", 0, 0, 3) == 0
    assert validate_whole("n", 3, 0, 3) == 3
    low = _whole_refused("n", -1, 0, 3)
    assert type(low) is InvalidInput
    assert (low.field, low.message) == ("n", "must be between 0 and 3, got -1")
    assert str(_whole_refused("n", 4, 0, 3)) == "n: must be between 0 and 3, got 4"
    for wrong in (True, 1.0, "1", None):
        refused = _whole_refused("n", wrong, 0, 3)
        assert str(refused) == f"n: must be a whole number, got {wrong!r}"


def test_validate_whole_groups_the_bound_and_raises_the_error_asked() -> None:
    plain = _whole_refused("n", 5001, 1, 5000)
    assert str(plain) == "n: must be between 1 and 5000, got 5001"
    grouped = _whole_refused("n", 5001, 1, 5000, grouped=True)
    assert str(grouped) == "n: must be between 1 and 5,000, got 5001"
    for value, message in (
        ("x", "must be a whole number, got 'x'"),
        (6, "must be between 1 and 5, got 6"),
    ):
        refused = _whole_refused("maximum", value, 1, 5, error=InvalidLimit)
        assert type(refused) is InvalidLimit
        assert str(refused) == f"maximum: {message}"
