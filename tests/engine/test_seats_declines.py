"""What the hot paths do with seat limits (``distinct``): the fast path and
the fast `check` decide them, reading the values' live events with the
counters; the one-trip function decides a single one (its value travels
with the charge), and the fast path declines a reservation of one
(`Need.HELD_SEATS`: the reference path refuses it), before anything is read
or written (docs/seats.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from metering.domain.events import make_event
from metering.domain.instants import to_us
from metering.domain.limits import Limit
from metering.domain.needs import Need
from metering.domain.rules import Rule
from metering.domain.windows import calendar_window
from metering.engine.answers import Batch, Declined, Hold
from metering.engine.fast import apply_records, check_record
from metering.engine.limit_cache import Allowances, LimitCache
from metering.engine.one_trip import prepare
from metering.storage.hot import ReadRequest, Snapshot, WantedSeat

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
LIMITS = (
    Limit("seats", maximum=1, period="1mo", window="calendar", distinct="user"),
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
def test_the_one_trip_function_takes_seats_and_reservations_leave_them_alone(
    cache: LimitCache, charges: list[tuple[str, str, int]]
) -> None:
    record = make_event(charges, NOW, "e1", {"user": "ann"}).record()
    now_us = to_us(NOW)
    assert not isinstance(prepare(cache, record, now_us), Declined)
    batch = Batch([record], now_us, "raise", hold=Hold(ttl_us=1_000_000), lookup_first=True)
    found = apply_records(None, cache, batch, store=Untouchable())
    assert isinstance(found, Declined) and found.need == Need.HELD_SEATS


def test_an_event_on_another_limit_stays_on_the_one_trip_path(cache: LimitCache) -> None:
    record = make_event([("org-1", "calls", 1)], NOW, "e1", {"user": "ann"}).record()
    assert not isinstance(prepare(cache, record, to_us(NOW)), Declined)


def test_the_fast_check_reads_the_seats_it_charges(cache: LimitCache) -> None:
    """The value's live events are asked for in the same read as the counters:
    a held value costs 0 and is allowed at the maximum, a new one is denied."""
    now_us = to_us(NOW)
    start = calendar_window(LIMITS[0].parsed_period, now_us)[0]
    asked: list[Sequence[WantedSeat]] = []

    def read(request: ReadRequest) -> Any:
        asked.append(request.seats)
        states = {("seats", "org-1", start): [1, 0, 0, None, None, 0, 1]}
        return Snapshot(1, {}, {}, states, seen={("seats", "org-1", start, "ann"): 2})

    held = make_event([("org-1", "seats", 1)], NOW, "e1", {"user": "ann"}).record()
    verdict = check_record(read, cache, held, now_us)
    assert not isinstance(verdict, Declined)
    assert (verdict.outcome, verdict.rows[0][2]) == ("allowed", 0)
    new = make_event([("org-1", "seats", 1)], NOW, "e2", {"user": "bob"}).record()
    verdict = check_record(read, cache, new, now_us)
    assert not isinstance(verdict, Declined)
    assert (verdict.outcome, verdict.denied_by) == ("denied", ("seats",))
    assert asked == [[("seats", "org-1", start, "ann")], [("seats", "org-1", start, "bob")]]
