"""A queued batch costs two round trips on PostgreSQL, counted at the driver
(`round_trips.count_round_trips`: pipelines, statements and transaction ends
outside one, on any psycopg connection): the read under lock, and the write
with its COMMIT, whatever the batch holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from round_trips import count_round_trips

from metering import FrozenClock, Limit, Meter, make_event
from metering.messages import encode_batch, encode_event
from metering.pipeline import apply_batch

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
LIMITS = [
    Limit("calls", maximum=700, period="1d", window="calendar"),
    Limit("burst", maximum=50, period="1m", algorithm="token_bucket"),
    Limit("trial", maximum=300, period="1h", window="first_use"),
]


def batch(start: int, size: int) -> dict[str, object]:
    names = ["calls", "burst", "trial"]
    events = [
        make_event([(f"org-{n % 97}", names[n % 3], 1 + n % 4)], NOW, f"e{n}")
        for n in range(start, start + size)
    ]
    items = [encode_event(event) for event in events]
    return encode_batch([*items, items[0]])  # and an id repeated within the batch


@pytest.mark.postgres
def test_a_batch_is_two_round_trips(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    trips = count_round_trips(monkeypatch)
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(LIMITS)

        def round_trips(payload: dict[str, object]) -> int:
            trips[0] = 0
            apply_batch(meter, payload)
            return trips[0]

        apply_batch(meter, batch(0, 10))  # warm: the first one caches the limits
        assert round_trips(batch(10, 1000)) == 2  # counters created and updated
        assert round_trips(batch(1010, 1000)) == 2
        assert round_trips(batch(10, 1000)) == 2  # delivered again: answered from the ledger
        assert meter.count_results() == 2010

        # Dead letters ride in the write's round trip: malformed input, and an
        # id used again with other charges (a conflict).
        hostile = batch(2010, 100)
        events = hostile["events"]
        assert isinstance(events, list)
        conflicting = encode_event(make_event([("org-1", "calls", 9)], NOW, "e10"))
        events += [{"id": "bad", "charges": "none", "at": 0}, "not an event", conflicting]
        assert round_trips(hostile) == 2
        reasons = [row.reason for row in meter.rejected_messages()]  # newest first
        assert reasons == [
            "event 'e10' was already recorded with different charges; "
            "the new charges were not applied",
            "malformed event: an event must be a JSON object",
            "malformed event: charges: must be a list of (subject, limit, cost)",
        ]
        assert meter.count_results() == 2110
