"""Fixtures of the report tests: the dataset of `report_dataset`, recorded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from report_dataset import EVENTS, record

from metering import FrozenClock, Meter


@pytest.fixture
def ledger(db_url: str) -> Iterator[Meter]:
    """A `Meter` on SQLite and on PostgreSQL holding `EVENTS`."""
    clock = FrozenClock(EVENTS[0][3])
    with Meter(db_url, clock=clock) as meter:
        record(meter, clock)
        yield meter


@pytest.fixture
def sqlite_ledger(sqlite_url: str) -> Iterator[Meter]:
    """`EVENTS` on SQLite only (for the CLI and the charts)."""
    clock = FrozenClock(EVENTS[0][3])
    with Meter(sqlite_url, clock=clock) as meter:
        record(meter, clock)
        yield meter
