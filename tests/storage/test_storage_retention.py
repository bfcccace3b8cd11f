"""Deleting rows older than their retention (`metering/storage/retention.py`)
on both databases: ``count`` answers the dry run with the condition
``delete_chunk`` deletes by, at most ``chunk`` rows a statement, until a
chunk comes back short; a table without a retention is refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection

from metering import FrozenClock, Limit, Meter
from metering.domain.events import Rejected
from metering.domain.instants import to_us
from metering.storage.retention import RetentionStore

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
CUT = to_us(T0 + timedelta(days=1))  # what was decided before is old enough


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    clock = FrozenClock(T0)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("api", maximum=1000, period="1h"))
        for n in range(5):
            meter.consume("org", "api", event_id=f"old-{n}")
        meter.apply_records([], rejected=[Rejected(None, "not a batch", "[]")])
        clock.set(T0 + timedelta(days=2))
        meter.consume("org", "api", event_id="young")
        yield meter


def _run(meter: Meter, work: object) -> int:
    def in_transaction(connection: Connection) -> int:
        return int(work(RetentionStore(connection)))  # type: ignore[operator]

    return meter.database.run(in_transaction)


def test_the_dry_run_counts_what_a_delete_takes(meter: Meter) -> None:
    assert _run(meter, lambda store: store.count("results", CUT)) == 5
    assert _run(meter, lambda store: store.count("rejected_messages", CUT)) == 1
    assert _run(meter, lambda store: store.count("results", to_us(T0))) == 0
    assert meter.count_results() == 6  # counting deleted nothing


def test_rows_go_a_chunk_at_a_time_until_a_chunk_comes_back_short(meter: Meter) -> None:
    chunks = [_run(meter, lambda store: store.delete_chunk("results", CUT, chunk=2))]
    while chunks[-1] == 2:
        chunks.append(_run(meter, lambda store: store.delete_chunk("results", CUT, chunk=2)))
    assert chunks == [2, 2, 1]
    assert meter.decided(["old-0", "young"]) == {"young"}
    assert _run(meter, lambda store: store.delete_chunk("rejected_messages", CUT)) == 1
    assert meter.rejected_messages() == []


def test_a_table_without_a_retention_is_refused(meter: Meter) -> None:
    with pytest.raises(ValueError, match="no retention for table 'counters'"):
        _run(meter, lambda store: store.count("counters", CUT))
    assert sum(c.used for c in meter.counters()) == 6
