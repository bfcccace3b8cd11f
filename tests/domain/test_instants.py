"""Instants (`domain/instants.py`): microseconds since the epoch and back,
within what a UTC datetime can hold; RFC 3339 text read by `parse_instant`;
`round_up`, the one rule for showing an instant at a coarser precision.

Each check is at the public edge: what passes must be safe to turn into a
datetime, and what fails names its argument in one line.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest

from metering.domain.bounds import (
    shown,
)
from metering.domain.instants import (
    MAX_US,
    MICROSECOND,
    MIN_US,
    as_utc,
    clock_text,
    from_us,
    parse_instant,
    round_up,
    to_us,
)
from metering.errors import InvalidInput, OccurredAtOutOfRange

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


def test_clock_text_shows_the_utc_second_rounded_up() -> None:
    noon = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert clock_text(noon) == "2026-11-22 12:00:00"
    assert clock_text(noon + timedelta(microseconds=1)) == "2026-11-22 12:00:01"
    assert clock_text(noon - timedelta(microseconds=1)) == "2026-11-22 12:00:00"
    assert clock_text(datetime(2026, 12, 31, 23, 59, 59, 500, tzinfo=UTC)) == "2027-01-01 00:00:00"
    kolkata = timezone(timedelta(hours=5, minutes=30))
    assert clock_text(datetime(2026, 3, 1, 5, 29, 9, tzinfo=kolkata)) == "2026-02-28 23:59:09"


def test_clock_text_is_utc_whatever_the_machines_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert clock_text(datetime(2026, 11, 22, 12, 0, tzinfo=UTC)) == "2026-11-22 12:00:00"
        # (the last instant is never moved into a zone past it)
        assert clock_text(datetime.max.replace(tzinfo=UTC)) == "9999-12-31 23:59:59"
    finally:
        monkeypatch.undo()
        time.tzset()
