"""Subjects' time zones: set one, read one or all (`metering.domain.zones` for the windows).

`set_time_zone` records a change at the database's now; it takes effect for each calendar
limit where the subject's current window ends (that window keeps its bounds). An unknown
zone name is `InvalidInput` and changes nothing; setting the zone in force changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from metering.domain.events import validate_subject
from metering.domain.instants import from_us
from metering.domain.jsonable import fields_dict
from metering.domain.zones import UTC_ZONE, ZoneHistory, validate_zone
from metering.storage.allowances import AllowanceStore
from metering.storage.database import Database


@dataclass(frozen=True, slots=True)
class SubjectZone:
    """A subject's time zone now, and since when (None: never set, UTC)."""

    subject: str
    time_zone: str
    since: datetime | None

    @classmethod
    def of(cls, subject: str, history: ZoneHistory) -> SubjectZone:
        if not history:
            return cls(subject, UTC_ZONE, None)
        since_us, zone = history[-1]
        return cls(subject, zone, from_us(since_us))

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


def set_time_zone(database: Database, subject: str, time_zone: str) -> SubjectZone:
    """Give ``subject`` the IANA zone ``time_zone`` from now on (see the module)."""
    validate_subject(subject)
    validate_zone(time_zone)
    now_us = database.now_us()

    def work(connection: Connection) -> SubjectZone:
        store = AllowanceStore(connection)
        store.set_time_zone(subject, time_zone, now_us)
        return SubjectZone.of(subject, store.time_zones([subject]).get(subject, ()))

    return database.run(work)


def subject_zone(database: Database, subject: str) -> SubjectZone:
    """``subject``'s zone (UTC, since None, when it never had one)."""
    validate_subject(subject)
    found = database.run(lambda c: AllowanceStore(c).time_zones([subject]))
    return SubjectZone.of(subject, found.get(subject, ()))


def subject_zones(database: Database) -> list[SubjectZone]:
    """Every subject that was given a zone, by subject."""
    found = database.run(lambda c: AllowanceStore(c).time_zones())
    return [SubjectZone.of(subject, history) for subject, history in sorted(found.items())]
