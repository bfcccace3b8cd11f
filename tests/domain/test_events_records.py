"""Events as stored, at the edges mutation testing found unasserted: the exact
text of a fingerprint, metadata's size counted as compact JSON, `charges_of`,
`UsageEvent.record`, and `records_of`, a batch's records.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest

from metering.domain.events import (
    Charge,
    EventRecord,
    UsageEvent,
    charges_of,
    fingerprint_of,
    make_event,
    records_of,
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


# Texts that JSON writes as they are, and some it escapes or that are not ASCII.
_TEXTS = ["org", "org-1 x", 'or"g', "or\\g", "org\n", "callé", "日本", "\u2028", "a\x7f", "x/y"]


def test_a_batchs_records_are_each_events_record_with_the_same_fingerprint() -> None:
    """`records_of` gives each event's record, its fingerprint the text the
    JSON encoder writes, escapes and all."""
    rng = random.Random(7)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    events = []
    for n in range(300):
        charges = [(rng.choice(_TEXTS), rng.choice(["calls", "tokens"]), rng.randint(0, 10**12))]
        if n % 5 == 0:
            charges.append(("other", "calls", 1))
        events.append(UsageEvent(f"e{n}", tuple(Charge(*c) for c in charges), at, {"n": n}))
    events.append(make_event([(_TEXTS[0], "calls", 3)], at, "made"))
    events[-1].fingerprint()  # known before: kept
    records = records_of(events)
    again = [UsageEvent(e.event_id, e.charges, e.occurred_at, e.metadata).record() for e in events]
    assert records == again
    for event, record in zip(events, records, strict=True):
        assert record.fingerprint == json.dumps(
            sorted(list(c) for c in event.charges), separators=(",", ":")
        )
        assert event.fingerprint() is record.fingerprint  # kept on the event
    # Again, each one-charge fingerprint now remembered: the same records.
    fresh = [UsageEvent(e.event_id, e.charges, e.occurred_at, e.metadata) for e in events]
    assert records_of(fresh) == again
    # A charge of another shape (not made by `make_event`) takes the encoder's
    # way, even when an equal charge's fingerprint is remembered (True == 1).
    assert records_of([make_event([("org", "calls", 1)], at)])[0].fingerprint == (
        '[["org","calls",1]]'
    )
    odd = UsageEvent("odd", (("org", "calls", True),), at)  # type: ignore[arg-type]
    assert records_of([odd])[0].fingerprint == '[["org","calls",true]]'
