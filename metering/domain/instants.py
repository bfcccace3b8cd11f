"""Instants as whole microseconds since the Unix epoch.

The domain computes with integers so that window edges and token refills are
exact; datetimes appear only at the edges (aware, UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from metering.errors import InvalidInput, OccurredAtOutOfRange

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND: Final = timedelta(microseconds=1)
US_PER_SECOND: Final = 1_000_000
# The instants a UTC datetime can hold: years 1 to 9999 once converted to UTC.
MIN_US: Final = (datetime.min.replace(tzinfo=UTC) - EPOCH) // MICROSECOND
MAX_US: Final = (datetime.max.replace(tzinfo=UTC) - EPOCH) // MICROSECOND


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
