"""The hot paths leave seat limits (``distinct``) to the reference engine:
the fast path raises `UseGeneralPath`, the one-trip function is not called,
the fast `check` answers None, before they read or write anything; events
on other limits are still theirs (docs/seats.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from metering.domain.events import make_event
from metering.domain.instants import to_us
from metering.domain.limits import Limit
from metering.domain.rules import Rule
from metering.engine.fast import Allowances, LimitCache, UseGeneralPath, apply_records, check_record
from metering.engine.one_trip import prepare

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
LIMITS = (
    Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user"),
    Limit("calls", maximum=5, period="1mo", window="calendar"),
)


class Untouchable:
    """A store or reader the hot path must not reach for a seat event."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the hot path touched {name}")

    def __call__(self, *args: Any) -> Any:
        raise AssertionError("the hot path read state")


@pytest.fixture
def cache() -> LimitCache:
    found = LimitCache()
    found.current = (1, {limit.name: Rule.of(limit) for limit in LIMITS}, Allowances())
    return found


SEAT_EVENTS = [
    [("org-1", "seats", 1)],
    [("org-1", "calls", 1), ("org-1", "seats", 1)],
]


@pytest.mark.parametrize("charges", SEAT_EVENTS)
def test_every_hot_path_declines_an_event_with_a_seat_charge(
    cache: LimitCache, charges: list[tuple[str, str, int]]
) -> None:
    record = make_event(charges, NOW, "e1", {"user": "ann"}).record()
    now_us = to_us(NOW)
    assert prepare(cache, record, now_us) is None
    assert check_record(Untouchable(), cache, record, now_us) is None
    with pytest.raises(UseGeneralPath):
        apply_records(
            None, cache, [record], now_us, invalid="raise", precheck=True, store=Untouchable()
        )


def test_an_event_on_another_limit_stays_on_the_one_trip_path(cache: LimitCache) -> None:
    record = make_event([("org-1", "calls", 1)], NOW, "e1", {"user": "ann"}).record()
    assert prepare(cache, record, to_us(NOW)) is not None
