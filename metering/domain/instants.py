"""Instants as whole microseconds since the Unix epoch.

The domain computes with integers so that window edges and token refills are
exact; datetimes appear only at the edges (aware, UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from metering.errors import InvalidInput

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND: Final = timedelta(microseconds=1)
US_PER_SECOND: Final = 1_000_000


def to_us(moment: datetime, *, field_name: str = "occurred_at") -> int:
    """An aware datetime as microseconds since the epoch."""
    if not isinstance(moment, datetime):
        raise InvalidInput(field_name, f"expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidInput(field_name, "must be timezone-aware (UTC), got a naive datetime")
    return (moment - EPOCH) // MICROSECOND


def from_us(us: int) -> datetime:
    """Microseconds since the epoch as an aware UTC datetime."""
    return EPOCH + timedelta(microseconds=us)
