"""The backtest's reads (`metering/storage/simulation.py`) on both databases:
the decided events of a period, bounds included, oldest first (ties by id),
each with its charge rows; rejected and voided events left out, a
reservation at its reserved cost; ``count_demand`` counts what ``demand``
yields."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection

from metering import FrozenClock, Limit, Meter, make_event
from metering.domain.events import FUTURE_TOLERANCE_US
from metering.domain.instants import to_us
from metering.storage.simulation import count_demand, demand

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    clock = FrozenClock(T0)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=4, period="1d", window="calendar"))
        meter.consume("org", "calls", 2, event_id="b-first")
        meter.consume("org", "calls", 1, event_id="a-same-time")
        clock.advance(minutes=1)
        meter.consume("org", "calls", 3, event_id="denied")
        meter.consume("org", "calls", 1, event_id="voided")
        meter.void("voided", "refund")
        meter.apply([make_event([("org", "nope", 1)], T0, "rejected")])
        meter.reserve("org", "calls", 1, event_id="held")
        clock.advance(minutes=1)
        meter.consume("org", "calls", 1, event_id="after")
        yield meter


def _read(meter: Meter, since: datetime, until: datetime) -> tuple[int, list[object]]:
    def work(connection: Connection) -> tuple[int, list[object]]:
        since_us, until_us = to_us(since), to_us(until)
        return count_demand(connection, since_us, until_us), list(
            demand(connection, since_us, until_us)
        )

    return meter.database.run(work)


def test_the_decided_events_of_a_period_oldest_first(meter: Meter) -> None:
    count, rows = _read(meter, T0, T0 + timedelta(minutes=1))
    assert count == len(rows) == 4
    found = [(at, [(c[0], c[1], c[2]) for c in charges]) for at, charges, _ in rows]  # type: ignore[misc]
    minute = to_us(T0 + timedelta(minutes=1))
    assert found == [
        (to_us(T0), [("org", "calls", 1)]),  # a-same-time before b-first: ties by id
        (to_us(T0), [("org", "calls", 2)]),
        (minute, [("org", "calls", 3)]),  # denied: decided, counted
        (minute, [("org", "calls", 1)]),  # the reservation at its reserved cost
    ]


def test_a_period_outside_the_events_is_empty(meter: Meter) -> None:
    assert _read(meter, T0 - timedelta(days=1), T0 - timedelta(microseconds=1)) == (0, [])
    assert _read(meter, T0 + timedelta(minutes=2), T0 + timedelta(minutes=2))[0] == 1


def test_an_event_decided_before_it_occurred_is_in_its_period(db_url: str) -> None:
    # Within the future's tolerance an event is decided before it occurs:
    # the decided time's bound of the scan leaves it in.
    with Meter(db_url, clock=FrozenClock(T0)) as meter:
        meter.set_limit(Limit("calls", maximum=4, period="1d", window="calendar"))
        ahead = T0 + timedelta(seconds=FUTURE_TOLERANCE_US // 1_000_000)
        meter.consume("org", "calls", 1, event_id="ahead", occurred_at=ahead)
        assert _read(meter, ahead, ahead)[0] == 1


def test_metadata_is_read_only_when_asked_for(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(T0)) as meter:
        meter.set_limit(Limit("calls", maximum=4, period="1d", window="calendar"))
        meter.consume("org", "calls", 1, event_id="with", metadata={"user": "u-7"})
        meter.consume("org", "calls", 1, event_id="without")

        def read(metadata: bool) -> list[object]:
            def work(connection: Connection) -> list[object]:
                rows = demand(connection, to_us(T0), to_us(T0), metadata=metadata)
                return [meta for _, _, meta in rows]

            return meter.database.run(work)

        assert read(True) == [{"user": "u-7"}, None]  # "with" before "without": ties by id
        assert read(False) == [None, None]
