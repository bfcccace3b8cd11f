"""Subjects' time zones as the service keeps them: set, read one, list; an
unknown zone or subject changes nothing; each change is kept with its instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Meter
from metering.errors import InvalidInput

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_a_subject_without_a_zone_is_in_utc_since_never(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        found = meter.subject_zone("org-1")
        assert (found.subject, found.time_zone, found.since) == ("org-1", "UTC", None)
        assert meter.subject_zones() == []


def test_set_read_and_list_with_the_instant_of_each_change(db_url: str) -> None:
    clock = FrozenClock(NOW)
    with Meter(db_url, clock=clock) as meter:
        meter.set_time_zone("org-2", "Asia/Kathmandu")
        clock.advance(timedelta(hours=1))
        changed = meter.set_time_zone("org-1", "Europe/Berlin")
        assert (changed.time_zone, changed.since) == ("Europe/Berlin", NOW + timedelta(hours=1))
        clock.advance(timedelta(hours=1))
        meter.set_time_zone("org-1", "America/Santiago")
        assert meter.subject_zone("org-1").time_zone == "America/Santiago"
        assert meter.subject_zone("org-1").since == NOW + timedelta(hours=2)
        listed = [(z.subject, z.time_zone) for z in meter.subject_zones()]
        assert listed == [("org-1", "America/Santiago"), ("org-2", "Asia/Kathmandu")]
        assert meter.subject_zone("org-2").to_dict()["time_zone"] == "Asia/Kathmandu"


@pytest.mark.parametrize(
    ("subject", "zone", "field"),
    [
        ("org-1", "Mars/Olympus_Mons", "time_zone"),
        ("org-1", "", "time_zone"),
        ("", "UTC", "subject"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    db_url: str, subject: str, zone: str, field: str
) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_time_zone("org-1", "Asia/Kolkata")
        with pytest.raises(InvalidInput) as raised:
            meter.set_time_zone(subject, zone)
        assert raised.value.field == field
        assert [(z.subject, z.time_zone) for z in meter.subject_zones()] == [
            ("org-1", "Asia/Kolkata")
        ]
