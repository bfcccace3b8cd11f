"""A queued batch costs two round trips on PostgreSQL, counted at the driver
(`round_trips.count_round_trips`: pipelines, statements and transaction ends
outside one, on any psycopg connection): the read under lock, and the write
with its COMMIT, whatever the batch holds; a single event one or two,
whatever it charges."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from round_trips import count_network_waits, count_round_trips

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.engine.paths import Direct
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event

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


def _priced(meter: Meter) -> None:
    meter.set_limit(spend_limit("spend", "1000", "USD", "1mo", window="calendar"))
    meter.set_price("calls", "0.01", "USD")


def _tiered(meter: Meter) -> None:
    meter.set_limit(spend_limit("spend", "1000", "USD", "1mo", window="calendar"))
    meter.set_price(
        "calls", None, "USD", model="volume", tiers=["2:0.02", "inf:0.01"], flat_fee="1"
    )


# What each configuration adds to the "calls" limit (as bench/bench_mix.py sells them).
CONFIGURATIONS = {
    "plain": lambda meter: None,
    "priced": _priced,
    "tiered": _tiered,
    "seats": lambda meter: meter.set_limit(
        Limit("calls", maximum=700, period="1d", window="calendar", distinct="user")
    ),
    "grant": lambda meter: meter.grant("org-1", "calls", 100, grant_id="g"),
    "recurring": lambda meter: meter.grant("org-1", "calls", 100, grant_id="m", every="1mo"),
    "entitlement": lambda meter: meter.set_entitlement("org-1", "calls", 900),
    "own thresholds": lambda meter: meter.set_alert("org-1", "calls", ["90%"]),
    "dimensions": lambda meter: meter.set_limit(
        Limit("calls", maximum=700, period="1d", window="calendar", dimensions=("user",))
    ),
    "paced": lambda meter: meter.set_limit(
        Limit("calls", maximum=700, period="1d", window="calendar", pacing=True)
    ),
    "gauge": lambda meter: meter.set_limit(
        Limit("calls", maximum=700, period="1d", window="calendar", aggregation="max")
    ),
    "time zone": lambda meter: meter.set_time_zone("org-1", "Asia/Kolkata"),
    "breaker": lambda meter: meter.set_limit(
        Limit("calls", maximum=700, period="1d", window="calendar", breaker="10x")
    ),
}


# What the one-trip function decides (each, tiered prices too).
ONE_TRIP = set(CONFIGURATIONS)


@pytest.mark.postgres
@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_a_single_event_is_one_or_two_round_trips(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, configuration: str
) -> None:
    """`consume` of one event is one round trip where the one-trip function
    decides it, else two (the read, then the write and its COMMIT); one
    again where the fast path speculates on the rows it cached
    (`metering.storage.hot.speculative`): the subject's last event was its."""
    trips = count_round_trips(monkeypatch)
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(LIMITS)
        CONFIGURATIONS[configuration](meter)
        for n in range(3):  # the first caches the limits, the rows
            trips[0] = 0
            assert meter.consume("org-1", "calls", metadata={"user": f"u{n}"}).allowed
        assert trips[0] == 1
        direct = meter._engine.path("direct")
        assert isinstance(direct, Direct) and direct.rows is not None
        direct.rows.clear()
        trips[0] = 0
        assert meter.consume("org-1", "calls", metadata={"user": "u3"}).allowed
        assert trips[0] == (1 if configuration in ONE_TRIP else 2)


@pytest.mark.postgres
@pytest.mark.parametrize("configuration", ["plain", "tiered", "priced", "grant", "seats"])
def test_the_network_waits_twice_for_a_read_then_write(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, configuration: str
) -> None:
    """Counted as the client waits for the server (`count_network_waits`):
    an event decided with a read, and a batch, wait twice (the read under
    lock with its BEGIN, then the writes with the COMMIT); the one-trip
    function and a speculative write once."""
    waits = count_network_waits(monkeypatch)
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(LIMITS)
        CONFIGURATIONS[configuration](meter)
        direct = meter._engine.path("direct")
        assert isinstance(direct, Direct) and direct.rows is not None
        for n in range(3):  # the first caches the limits, the rows
            waits[0] = 0
            assert meter.consume("org-1", "calls", metadata={"user": f"u{n}"}).allowed
        assert waits[0] == 1
        direct.rows.clear()
        waits[0] = 0
        assert meter.consume("org-1", "calls", metadata={"user": "u3"}).allowed
        assert waits[0] == (1 if configuration in ONE_TRIP else 2)

        apply_batch(meter, batch(0, 10))
        waits[0] = 0
        apply_batch(meter, batch(10, 100))
        assert waits[0] == 2
        waits[0] = 0
        apply_batch(meter, batch(110, 100))  # counters updated
        assert waits[0] == 2
