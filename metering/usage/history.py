"""A subject's usage of one limit over time: ``GET /v1/subjects/{s}/usage/history``.

`usage_history` reads what is there (`source_of`): a limit with dimensions has hourly
rollups, exact to the hour (``source: rollups``); any other limit has its counters, a
window's usage in the bucket its window starts in (``source: counters``); a token bucket
keeps no windows (``source: none``). A gauge's bucket shows its windows' peak or last
level. Each bucket carries the maximum in force at its end, the limit's default of then
where no entitlement applies (`metering.domain.history`).
Buckets are UTC hours and days; a zoned subject's also carry ``time_zone`` (in force at
the bucket's start) and ``local_window`` (`metering.domain.zones.local_span`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from metering.domain.definitions import Definition
from metering.domain.events import validate_subject
from metering.domain.history import Bucket, Point, bucket_start, series, validate_bucket
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit, validate_limit_name
from metering.domain.zones import UTC_ZONE, ZoneHistory, local_span, zone_before
from metering.limits.service import get_limit
from metering.storage.allowances import AllowanceStore
from metering.storage.database import Database
from metering.storage.history import counter_windows, entitlement_changes, rollup_hours
from metering.storage.limits import LimitStore

Source = Literal["rollups", "counters", "none"]
DEFAULT_SPAN: Final[dict[str, timedelta]] = {
    "hour": timedelta(hours=48),
    "day": timedelta(days=30),
}


@dataclass(frozen=True, slots=True)
class UsageHistory:
    subject: str
    limit: Limit
    bucket: Bucket
    source: Source
    since: datetime
    until: datetime
    points: list[Point]
    # The subject's changes of time zone (`metering.domain.zones`): none, UTC.
    zones: ZoneHistory = ()

    def label(self, point: Point) -> tuple[str | None, str | None]:
        """A bucket's zone and local label, for a subject with a time zone then."""
        zone = zone_before(self.zones, point.start_us + 1) if self.zones else UTC_ZONE
        if zone == UTC_ZONE:
            return None, None
        return zone, local_span(point.start_us, point.end_us, zone)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "limit": self.limit.name,
            "bucket": self.bucket,
            "source": self.source,
            "from": self.since.isoformat(),
            "to": self.until.isoformat(),
            "points": [
                {
                    "start": from_us(p.start_us).isoformat(),
                    "end": from_us(p.end_us).isoformat(),
                    "used": p.used,
                    "maximum": p.maximum,
                    **dict(zip(("time_zone", "local_window"), self.label(p), strict=True)),
                }
                for p in self.points
            ],
        }


def source_of(limit: Limit) -> Source:
    if limit.dimensions:
        return "rollups"
    if limit.algorithm == "token_bucket":
        return "none"
    return "counters"


def usage_history(
    database: Database,
    subject: str,
    limit: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    bucket: str = "day",
) -> UsageHistory:
    """``subject``'s use of ``limit`` per hour or day over ``[since, until)``
    (default: up to now, the last 48 hours by hour or 30 days by day)."""
    validate_subject(subject)
    validate_limit_name(limit)
    checked = validate_bucket(bucket)
    found = get_limit(database, limit)
    until_us = to_us(until, field_name="to") if until is not None else database.now_us()
    since_us = (
        to_us(since, field_name="from")
        if since is not None
        else until_us - int(DEFAULT_SPAN[checked].total_seconds() * 1_000_000)
    )
    source = source_of(found)
    first_us = bucket_start(since_us, checked)  # the first bucket meets `since`: all of it
    zones: list[tuple[int, str]] = []

    defaults: list[Definition] = []

    def read(connection: Any) -> tuple[list[tuple[int, int]], list[tuple[int, int | None]]]:
        zones.extend(AllowanceStore(connection).time_zones([subject]).get(subject, ()))
        defaults.extend(LimitStore(connection).definition_history([found.name]).get(found.name, []))
        changes = entitlement_changes(connection, subject, found.name)
        if source == "rollups":
            dimension = found.dimensions[0]
            usage = rollup_hours(connection, subject, found.name, dimension, first_us, until_us)
        elif source == "counters":
            rows = counter_windows(connection, subject, found.name, first_us, until_us)
            usage = [(row.window_start_us, row.used) for row in rows]
        else:
            usage = []
        return usage, changes

    usage, changes = database.read(read)
    default = found.window_maximum
    points = series(
        usage, changes, default, since_us, until_us, checked, found.aggregation, defaults
    )
    return UsageHistory(
        subject, found, checked, source, from_us(since_us), from_us(until_us), points, tuple(zones)
    )
