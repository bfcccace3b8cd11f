"""Fixtures for the unit tests of the pure domain.

The domain works on plain values and instants in microseconds since the
epoch, so these tests need no database and never sleep: time is a number.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.clock import FrozenClock
from metering.domain.instants import to_us

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    """A clock standing still at 2026-11-22 12:00 UTC until a test moves it."""
    return FrozenClock(START)


@pytest.fixture
def now_us(clock: FrozenClock) -> int:
    """The frozen clock's instant in microseconds since the epoch."""
    return to_us(clock())
