"""Events as stored, at the edges mutation testing found unasserted: the exact
text of a fingerprint, metadata's size counted as compact JSON, `charges_of`
and `UsageEvent.record`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.domain.events import (
    Charge,
    EventRecord,
    charges_of,
    fingerprint_of,
    make_event,
    validate_metadata,
)
from metering.domain.instants import to_us
from metering.errors import InvalidInput


def test_a_fingerprint_is_compact_json_of_the_sorted_charges() -> None:
    """Stored beside each result: another text would make every repeat a conflict."""
    charges = [("user-7", "calls", 2), ("org", "seats", 1)]
    assert fingerprint_of(charges) == '[["org","seats",1],["user-7","calls",2]]'
    event = make_event(charges, datetime(2026, 1, 1, tzinfo=UTC), event_id="e")
    assert event.fingerprint() == '[["org","seats",1],["user-7","calls",2]]'


def test_metadata_size_is_counted_as_compact_json() -> None:
    overhead = len('{"a":"","b":""}')
    fits = {"a": "x" * (8192 - overhead), "b": ""}
    assert validate_metadata(fits) == fits
    with pytest.raises(InvalidInput, match="larger than 8192 bytes"):
        validate_metadata({"a": "x" * (8193 - overhead), "b": ""})


def test_charges_of_takes_one_charge_or_a_list() -> None:
    assert charges_of("org", "calls", 3, None) == [("org", "calls", 3)]
    given = [("org", "calls", 1)]
    assert charges_of(None, None, 1, given) is given


def test_an_event_record_is_the_event_as_plain_values() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    event = make_event([("org", "calls", 2)], at, event_id="e1", metadata={"k": 1})
    assert event.record() == EventRecord(
        "e1", (Charge("org", "calls", 2),), to_us(at), {"k": 1}, '[["org","calls",2]]'
    )
