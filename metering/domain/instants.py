"""Instants as whole microseconds since the Unix epoch.

The domain computes with integers so that window edges and token refills are
exact; datetimes appear only at the edges (aware, UTC). Text becomes an
instant in one place, `parse_instant` (RFC 3339), for the command line, the
HTTP API and the limits and entitlements files alike; an instant becomes
text at a coarser precision through `round_up`, the one rounding rule of
what is shown: to the second (`clock_text`), the same for a window's bounds
in every table, report, chart and page.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Final

from metering.domain.bounds import shown
from metering.errors import InvalidInput, OccurredAtOutOfRange

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND: Final = timedelta(microseconds=1)
SHOWN_UNIT: Final = timedelta(seconds=1)
US_PER_SECOND: Final = 1_000_000
# The instants a UTC datetime can hold: years 1 to 9999 once converted to UTC.
MIN_US: Final = (datetime.min.replace(tzinfo=UTC) - EPOCH) // MICROSECOND
MAX_US: Final = (datetime.max.replace(tzinfo=UTC) - EPOCH) // MICROSECOND
# RFC 3339: full-date, then optionally "T" (or "t", or a space) and a time with
# an offset ("Z" or ±hh:mm). Seconds may be left out (12:00 is 12:00:00);
# where an interface allows it, a time without an offset is UTC and a bare
# date is its midnight UTC. Nothing else of ISO 8601: no week dates
# (2026-W48-4), ordinal dates (2026-330), basic format (20261126T0500Z) or
# hours alone.
RFC3339: Final = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"(?:[Tt ](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})"
    r"(?::(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]{1,9}))?)?"
    r"(?P<offset>[Zz]|(?P<sign>[+-])(?P<offset_hours>[0-9]{2}):(?P<offset_minutes>[0-9]{2}))?)?"
)
WEEK_DATE: Final = re.compile(r"[0-9]{4}-?[Ww][0-9]{2}")
ORDINAL_DATE: Final = re.compile(r"[0-9]{4}-?[0-9]{3}(?:[Tt ]|$)")
EXAMPLE: Final = "2026-11-22T12:00:00Z"


def to_us(moment: datetime, *, field_name: str = "occurred_at") -> int:
    """An aware datetime as microseconds since the epoch.

    `InvalidInput` (`OccurredAtOutOfRange` for ``occurred_at``) when it is
    not aware, or lies outside years 1 to 9999 once in UTC (such as
    ``0001-01-01T00:00:00+01:00``): `from_us` could not turn it back.
    """
    if not isinstance(moment, datetime):
        raise InvalidInput(field_name, f"expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidInput(field_name, "must be timezone-aware (UTC), got a naive datetime")
    us = (moment - EPOCH) // MICROSECOND
    if not MIN_US <= us <= MAX_US:
        message = f"{moment.isoformat()} is outside years 1 to 9999 in UTC"
        if field_name == "occurred_at":
            raise OccurredAtOutOfRange(moment, message)
        raise InvalidInput(field_name, message)
    return us


def as_utc(moment: datetime, *, field_name: str) -> datetime:
    """An aware datetime in UTC; naive means UTC. `InvalidInput` when UTC cannot hold it."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(
            field_name, f"{moment.isoformat()} is outside years 1 to 9999 in UTC"
        ) from None


def from_us(us: int) -> datetime:
    """Microseconds since the epoch as an aware UTC datetime."""
    return EPOCH + timedelta(microseconds=us)


def parse_instant(
    text: object, *, field_name: str, naive_is_utc: bool = True, dates: bool = True
) -> datetime:
    """An RFC 3339 time (`RFC3339`) as an aware datetime in UTC.

    With ``naive_is_utc`` a time without an offset means UTC, else it is an
    error; with ``dates`` a bare ``YYYY-MM-DD`` is its midnight UTC, else an
    error. Fractions beyond microseconds are cut. `InvalidInput` naming
    ``field_name`` for anything else, ISO 8601's week and ordinal dates
    named as such.
    """
    if not isinstance(text, str):
        raise InvalidInput(
            field_name, f"expected an RFC 3339 time like {EXAMPLE}, got {shown(text)}"
        )
    found = RFC3339.fullmatch(text)  # [0-9], not \d: digits of other scripts are refused
    if found is None:
        raise InvalidInput(field_name, _not_rfc3339(text))
    if found["hour"] is None and not dates:
        raise InvalidInput(field_name, f"{shown(text)} is a date; give a time like {EXAMPLE}")
    if found["hour"] is not None and found["offset"] is None and not naive_is_utc:
        raise InvalidInput(
            field_name, f"{shown(text)} has no time zone: end it with Z or an offset like +01:00"
        )
    try:
        moment = datetime(
            int(found["year"]),
            int(found["month"]),
            int(found["day"]),
            int(found["hour"] or 0),
            int(found["minute"] or 0),
            int(found["second"] or 0),
            int((found["fraction"] or "0")[:6].ljust(6, "0")),
            tzinfo=_offset(found),
        )
    except ValueError as exc:  # month 13, February 30, hour 24, second 60 ...
        raise InvalidInput(field_name, f"{shown(text)} is not a valid time: {exc}") from None
    return as_utc(moment, field_name=field_name)


def _offset(found: re.Match[str]) -> timezone:
    if found["sign"] is None:
        return UTC  # "Z", or none where that means UTC
    minutes = int(found["offset_hours"]) * 60 + int(found["offset_minutes"])
    if int(found["offset_hours"]) > 23 or int(found["offset_minutes"]) > 59:
        raise ValueError(f"offset {found['offset']} is out of range")
    return timezone(timedelta(minutes=-minutes if found["sign"] == "-" else minutes))


def _not_rfc3339(text: str) -> str:
    what = f"{shown(text)} is not an RFC 3339 time like {EXAMPLE}"
    if WEEK_DATE.match(text):
        return what + " (ISO week dates such as 2026-W48-4 are not accepted)"
    if ORDINAL_DATE.match(text):
        return what + " (ordinal dates such as 2026-330 are not accepted)"
    return what


def round_up(moment: datetime, unit: timedelta) -> datetime:
    """``moment`` rounded up to a whole ``unit`` (a second, a minute) in UTC:
    the one rule for showing an instant at a coarser precision, so that a
    time shown (a reset, a window's end) is never earlier than the instant.
    The last instant UTC can hold rounds down instead (nothing is later)."""
    step = unit // MICROSECOND
    us = (moment - EPOCH) // MICROSECOND
    rounded = -(-us // step) * step
    return from_us(rounded if rounded <= MAX_US else rounded - step)


def clock_text(moment: datetime) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in UTC, rounded up to the second (`round_up`):
    how an instant is shown, a window's start and end alike."""
    return f"{round_up(moment.astimezone(UTC), SHOWN_UNIT):%Y-%m-%d %H:%M:%S}"
