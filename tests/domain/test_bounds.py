"""The bounds on plain numbers (`domain/bounds.py`) and on instants (`domain/instants.py`).

Each check is at the public edge: what passes must be safe to bind in SQL
or to turn into a datetime, and what fails names its argument in one line.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone, tzinfo
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
from metering.domain.instants import (
    MAX_US,
    MICROSECOND,
    MIN_US,
    as_utc,
    from_us,
    parse_instant,
    round_up,
    to_us,
)
from metering.errors import InvalidInput, InvalidLimit, OccurredAtOutOfRange

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


# --------------------------------------------------------------------------- instants


class NoOffset(tzinfo):
    """A tzinfo that does not know its offset: the datetime is naive after all."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


def test_to_us_counts_microseconds_from_the_epoch() -> None:
    assert to_us(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    assert to_us(datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC)) == 1_000_005
    plus_two = timezone(timedelta(hours=2))
    assert to_us(datetime(1970, 1, 1, 2, tzinfo=plus_two)) == 0


def test_to_us_accepts_the_first_and_last_microsecond_utc_can_hold() -> None:
    first = datetime.min.replace(tzinfo=UTC)
    last = datetime.max.replace(tzinfo=UTC)
    assert to_us(first) == MIN_US and from_us(MIN_US) == first
    assert to_us(last) == MAX_US and from_us(MAX_US) == last


@pytest.mark.parametrize(
    "moment",
    [
        datetime.min.replace(tzinfo=timezone(timedelta(minutes=1))),
        datetime.max.replace(tzinfo=timezone(timedelta(minutes=-1))),
    ],
)
def test_an_instant_utc_cannot_hold_is_out_of_range(moment: datetime) -> None:
    with pytest.raises(OccurredAtOutOfRange) as raised:
        to_us(moment)
    assert raised.value.occurred_at is moment
    assert raised.value.field == "occurred_at"
    assert raised.value.message == f"{moment.isoformat()} is outside years 1 to 9999 in UTC"


def test_an_out_of_range_instant_of_another_field_is_invalid_input_naming_it() -> None:
    moment = datetime.min.replace(tzinfo=timezone(timedelta(hours=1)))
    with pytest.raises(InvalidInput) as raised:
        to_us(moment, field_name="at")
    assert type(raised.value) is InvalidInput
    assert str(raised.value) == "at: 0001-01-01T00:00:00+01:00 is outside years 1 to 9999 in UTC"


@pytest.mark.parametrize("moment", [datetime(2026, 1, 1), datetime(2026, 1, 1, tzinfo=NoOffset())])
def test_to_us_refuses_a_datetime_without_an_offset(moment: datetime) -> None:
    with pytest.raises(InvalidInput) as raised:
        to_us(moment, field_name="since")
    assert str(raised.value) == "since: must be timezone-aware (UTC), got a naive datetime"


def test_to_us_refuses_what_is_not_a_datetime() -> None:
    with pytest.raises(InvalidInput) as raised:
        to_us("2026-01-01", field_name="until")  # type: ignore[arg-type]
    assert str(raised.value) == "until: expected a datetime, got str"


def test_as_utc_takes_a_naive_datetime_as_utc_and_converts_an_aware_one() -> None:
    assert as_utc(datetime(2026, 1, 1, 12), field_name="at") == datetime(2026, 1, 1, 12, tzinfo=UTC)
    paris = datetime(2026, 1, 1, 13, tzinfo=timezone(timedelta(hours=1)))
    converted = as_utc(paris, field_name="at")
    assert converted == paris and converted.tzinfo is UTC and converted.hour == 12


def test_as_utc_refuses_an_instant_utc_cannot_hold() -> None:
    moment = datetime.min.replace(tzinfo=timezone(timedelta(hours=1)))
    with pytest.raises(InvalidInput) as raised:
        as_utc(moment, field_name="since")
    assert str(raised.value) == "since: 0001-01-01T00:00:00+01:00 is outside years 1 to 9999 in UTC"
    assert raised.value.__suppress_context__


# --------------------------------------------------------------------------- parse_instant

PARIS = timezone(timedelta(hours=1))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-26T05:00:00Z", datetime(2026, 11, 26, 5, tzinfo=UTC)),
        ("2026-11-26t05:00:00z", datetime(2026, 11, 26, 5, tzinfo=UTC)),
        ("2026-11-26 05:00:00Z", datetime(2026, 11, 26, 5, tzinfo=UTC)),
        ("2026-11-26T05:00:00+01:00", datetime(2026, 11, 26, 4, tzinfo=UTC)),
        ("2026-11-26T05:00:00-02:30", datetime(2026, 11, 26, 7, 30, tzinfo=UTC)),
        ("2026-11-26T05:00:00-00:00", datetime(2026, 11, 26, 5, tzinfo=UTC)),
        ("2026-11-26T05:00:07.5Z", datetime(2026, 11, 26, 5, 0, 7, 500_000, tzinfo=UTC)),
        ("2026-11-26T05:00:07.000001Z", datetime(2026, 11, 26, 5, 0, 7, 1, tzinfo=UTC)),
        ("2026-11-26T05:00:07.123456789Z", datetime(2026, 11, 26, 5, 0, 7, 123456, tzinfo=UTC)),
        ("2026-11-26T05:07Z", datetime(2026, 11, 26, 5, 7, tzinfo=UTC)),  # seconds left out
        ("2026-11-26T05:07", datetime(2026, 11, 26, 5, 7, tzinfo=UTC)),  # naive: UTC
        ("2026-11-26", datetime(2026, 11, 26, tzinfo=UTC)),  # a date: its midnight
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),
        ("9999-12-31T23:59:59.999999Z", datetime.max.replace(tzinfo=UTC)),
    ],
)
def test_parse_instant_reads_rfc_3339(text: str, expected: datetime) -> None:
    parsed = parse_instant(text, field_name="at")
    assert parsed == expected and parsed.tzinfo is UTC


NOT_RFC3339 = "is not an RFC 3339 time like 2026-11-22T12:00:00Z"
WEEK = f"{NOT_RFC3339} (ISO week dates such as 2026-W48-4 are not accepted)"
ORDINAL = f"{NOT_RFC3339} (ordinal dates such as 2026-330 are not accepted)"
INVALID = "is not a valid time:"
FULLWIDTH = "\uff12\uff10\uff12\uff16-11-26"  # digits of another script


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2026-W48-4T05:00:00Z", WEEK),
        ("2026W484", WEEK),
        ("2026-w48", WEEK),
        ("2026-330", ORDINAL),
        ("2026-330T05:00Z", ORDINAL),
        ("2026330", ORDINAL),
        ("20261126T050000Z", NOT_RFC3339),
        ("2026-11-26T05Z", NOT_RFC3339),
        ("2026-11-26T05:00:00+0100", NOT_RFC3339),
        ("2026-11-26T05:00:00+01", NOT_RFC3339),
        ("2026-11-26T05:00:00.Z", NOT_RFC3339),
        ("2026-11-26T05:00:00.1234567890Z", NOT_RFC3339),
        (" 2026-11-26", NOT_RFC3339),
        ("2026-11-26\n", NOT_RFC3339),
        ("2026-11-26T05:00:00Z" + "0" * 30, NOT_RFC3339),
        (FULLWIDTH, NOT_RFC3339),
        ("yesterday", NOT_RFC3339),
        ("", NOT_RFC3339),
        ("2026-13-01", f"{INVALID} month must be in 1..12"),
        ("2026-02-30T00:00Z", f"{INVALID} day is out of range for month"),
        ("2026-11-26T24:00Z", f"{INVALID} hour must be in 0..23"),
        ("2026-11-26T05:60Z", f"{INVALID} minute must be in 0..59"),
        ("2026-11-26T05:00:60Z", f"{INVALID} second must be in 0..59"),
        ("2026-11-26T05:00+24:00", f"{INVALID} offset +24:00 is out of range"),
        ("2026-11-26T05:00+23:60", f"{INVALID} offset +23:60 is out of range"),
    ],
)
def test_parse_instant_refuses_what_is_not_rfc_3339(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_instant(text, field_name="at")
    assert (raised.value.field, raised.value.message) == ("at", f"{shown(text)} {message}")


def test_parse_instant_refuses_an_instant_utc_cannot_hold() -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_instant("0001-01-01T00:00+01:00", field_name="at")
    assert str(raised.value) == "at: 0001-01-01T00:00:00+01:00 is outside years 1 to 9999 in UTC"


def test_parse_instant_takes_the_last_offset_a_day_holds() -> None:
    found = parse_instant("2026-11-26T23:59+23:59", field_name="at")
    assert found == datetime(2026, 11, 26, 0, 0, tzinfo=UTC)
    assert parse_instant("2026-11-26T00:00-23:59", field_name="at").hour == 23


def test_parse_instant_can_require_an_offset_and_a_time() -> None:
    def strict(text: str) -> datetime:
        return parse_instant(text, field_name="time", naive_is_utc=False, dates=False)

    assert strict("2026-11-26T05:00:00Z") == datetime(2026, 11, 26, 5, tzinfo=UTC)
    with pytest.raises(InvalidInput) as raised:
        strict("2026-11-26T05:00:00")
    assert str(raised.value) == (
        "time: '2026-11-26T05:00:00' has no time zone: end it with Z or an offset like +01:00"
    )
    with pytest.raises(InvalidInput) as raised:
        strict("2026-11-26")
    assert (
        str(raised.value) == "time: '2026-11-26' is a date; give a time like 2026-11-22T12:00:00Z"
    )
    # Each rule alone: a date is no naive time, and a naive time is no date.
    assert parse_instant("2026-11-26", field_name="t", naive_is_utc=False).hour == 0
    assert parse_instant("2026-11-26T05:00", field_name="t", dates=False).hour == 5


@pytest.mark.parametrize(
    "value", [None, 20261126, datetime(2026, 11, 26, tzinfo=UTC), b"2026-11-26"]
)
def test_parse_instant_refuses_what_is_not_text(value: object) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_instant(value, field_name="since")
    assert str(raised.value) == (
        f"since: expected an RFC 3339 time like 2026-11-22T12:00:00Z, got {shown(value)}"
    )


# --------------------------------------------------------------------------- round_up

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("moment", "unit", "expected"),
    [
        (utc(2026, 11, 26, 4, 45, 8, 1), SECOND, utc(2026, 11, 26, 4, 45, 9)),
        (utc(2026, 11, 26, 4, 45, 8, 999_999), SECOND, utc(2026, 11, 26, 4, 45, 9)),
        (utc(2026, 11, 26, 4, 45, 8), SECOND, utc(2026, 11, 26, 4, 45, 8)),
        (utc(2026, 11, 26, 4, 45, 0, 1), MINUTE, utc(2026, 11, 26, 4, 46)),
        (utc(2026, 11, 26, 4, 45), MINUTE, utc(2026, 11, 26, 4, 45)),
        (datetime(2026, 11, 26, 5, 45, 8, 1, tzinfo=PARIS), SECOND, utc(2026, 11, 26, 4, 45, 9)),
        (utc(1969, 12, 31, 23, 59, 59, 500_000), SECOND, utc(1970, 1, 1)),
        (utc(1, 1, 1, 0, 0, 0, 1), SECOND, utc(1, 1, 1, 0, 0, 1)),
        # Nothing is later than the last instant UTC holds: it rounds down.
        (datetime.max.replace(tzinfo=UTC), SECOND, utc(9999, 12, 31, 23, 59, 59)),
        (utc(9999, 12, 31, 23, 59, 59), SECOND, utc(9999, 12, 31, 23, 59, 59)),
        (datetime.max.replace(tzinfo=UTC), MICROSECOND, datetime.max.replace(tzinfo=UTC)),
        (utc(2026, 11, 26, 4, 45, 8, 7), MICROSECOND, utc(2026, 11, 26, 4, 45, 8, 7)),
    ],
)
def test_round_up_never_shows_a_time_earlier_than_it_is(
    moment: datetime, unit: timedelta, expected: datetime
) -> None:
    rounded = round_up(moment, unit)
    assert rounded == expected and rounded.tzinfo is UTC


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
