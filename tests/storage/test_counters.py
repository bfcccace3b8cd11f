"""`CounterStore`'s reset: on PostgreSQL it clears the counters it waited
for, and the held charges on them, even of a reservation held meanwhile; on
both databases a reset is recorded only when it cleared something. Which
limits have usage in windows not yet over."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from lock_waits import WAIT_SECONDS, wait_until_blocked
from sqlalchemy import func, select, text

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import to_us
from metering.domain.reservations import HeldCharge
from metering.storage.counters import CounterStore
from metering.storage.reservations import ReservationStore
from metering.storage.tables import counter_resets, results

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _meter(url: str) -> Meter:
    meter = Meter(url, clock=FrozenClock(NOW))
    meter.set_limit(Limit("calls", maximum=1000, period="1d", window="calendar"))
    return meter


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with _meter(pg_url) as meter:
        yield meter


@pytest.fixture
def any_meter(db_url: str) -> Iterator[Meter]:
    with _meter(db_url) as meter:
        yield meter


def _resets(meter: Meter) -> int:
    with meter.sql_engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(counter_resets)).scalar())


def test_a_reset_clears_a_counter_updated_while_it_waited(meter: Meter) -> None:
    for n in range(3):
        meter.consume("org-1", "calls", event_id=f"e{n}")
    cleared: list[int] = []
    with meter.sql_engine.connect() as other, meter.sql_engine.connect() as watcher:
        other.execute(text("UPDATE counters SET used = used + 1 WHERE subject = 'org-1'"))
        blocker = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
        resetting = threading.Thread(target=lambda: cleared.append(meter.reset(subject="org-1")))
        resetting.start()
        wait_until_blocked(watcher, blocker, "the reset")
        other.commit()
        resetting.join(WAIT_SECONDS)
    assert cleared == [1]
    assert meter.counters("org-1", "calls") == []
    assert _resets(meter) == 1


def test_a_reset_that_clears_nothing_records_nothing(any_meter: Meter) -> None:
    meter = any_meter
    meter.consume("org-1", "calls", event_id="e1")
    assert meter.reset(subject="org-2") == 0
    assert _resets(meter) == 0
    assert meter.void("e1", "refund").charges != ()
    assert meter.counters("org-1", "calls")[0].used == 0


def test_a_reservation_held_while_a_reset_waited_is_forgotten_with_its_counter(
    meter: Meter,
) -> None:
    """A reserve that commits after the reset looked at the held reservations,
    but before it locked their counter: its held units are cleared, so a
    cancel afterwards gives the counter that started over nothing."""
    meter.consume("org-1", "calls", event_id="e1")
    [counter] = meter.counters("org-1", "calls")
    assert counter.window_start is not None and counter.window_end is not None
    held = HeldCharge("org-1", "calls", 5, to_us(counter.window_start), to_us(counter.window_end))
    cleared: list[int] = []
    with meter.sql_engine.connect() as other, meter.sql_engine.connect() as watcher:
        # What a reserve does: lock the counter, add the cost, insert the row.
        other.execute(text("UPDATE counters SET used = used + 5 WHERE subject = 'org-1'"))
        ReservationStore(other).insert("held-1", [held], to_us(NOW), to_us(NOW) + 60_000_000)
        blocker = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
        resetting = threading.Thread(target=lambda: cleared.append(meter.reset(subject="org-1")))
        resetting.start()
        wait_until_blocked(watcher, blocker, "the reset")
        other.commit()
        resetting.join(WAIT_SECONDS)
    assert cleared == [1]
    meter.consume("org-1", "calls", cost=2, event_id="e2")
    assert meter.cancel_reservation("held-1") == 0
    assert [c.used for c in meter.counters("org-1", "calls")] == [2]


def test_a_reset_records_only_the_counters_it_cleared(meter: Meter) -> None:
    """A counter first created while the reset waited is not cleared, and a
    void of its event gives the event back."""
    meter.set_limit(Limit("other", maximum=1000, period="1d", window="calendar"))
    meter.consume("org-1", "calls", event_id="e1")
    cleared: list[int] = []
    with meter.sql_engine.connect() as other, meter.sql_engine.connect() as watcher:
        other.execute(text("UPDATE counters SET used = used + 1 WHERE subject = 'org-1'"))
        blocker = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
        resetting = threading.Thread(target=lambda: cleared.append(meter.reset(subject="org-1")))
        resetting.start()
        wait_until_blocked(watcher, blocker, "the reset")
        meter.consume("org-1", "other", cost=4, event_id="new-key")
        other.commit()
        resetting.join(WAIT_SECONDS)
    assert cleared == [1]
    assert [c.used for c in meter.counters("org-1", "other")] == [4]
    assert [c[2] for c in meter.void("new-key", "refund").charges] == [4]
    assert [c.used for c in meter.counters("org-1", "other")] == [0]


def test_resets_are_ordered_by_the_reset_clock_and_older_rows_by_time(any_meter: Meter) -> None:
    """A reset row has the clock's tick; a void of an event written before it
    skips the counter, one written after gives back. A row of an earlier
    version (no tick, no window) counts when timed at or after the
    decision."""
    meter = any_meter
    meter.consume("org-1", "calls", cost=3, event_id="before")
    assert meter.reset(subject="org-1") == 1
    meter.consume("org-1", "calls", cost=2, event_id="after")
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(
            select(counter_resets.c.window_start_us, counter_resets.c.tick)
        ).all()
        written = connection.execute(
            select(results.c.reset_tick).where(results.c.event_id == "before")
        ).scalar_one()
    assert [tuple(row) for row in rows] == [(to_us(NOW.replace(hour=0)), written + 1)]
    assert meter.void("before", "refund").charges == ()
    assert [c[2] for c in meter.void("after", "refund").charges] == [2]

    meter.consume("org-1", "calls", cost=5, event_id="legacy")
    with meter.sql_engine.begin() as connection:
        connection.execute(
            counter_resets.insert().values(subject=None, limit_name="calls", reset_at_us=to_us(NOW))
        )
    assert meter.void("legacy", "refund").charges == ()  # the same microsecond: after
    assert [c.used for c in meter.counters("org-1", "calls")] == [5]


def test_usage_in_windows_not_over_is_found_by_limit(any_meter: Meter) -> None:
    any_meter.set_limit(Limit("tokens", maximum=1000, period="1d", window="calendar"))
    any_meter.consume("org-1", "calls", 2)
    now_us, day_us = to_us(NOW), 86_400_000_000
    with any_meter.sql_engine.connect() as connection:
        store = CounterStore(connection)
        assert store.used_in_windows_after("calls", now_us)
        assert not store.used_in_windows_after("tokens", now_us)  # no usage counted
        assert not store.used_in_windows_after("calls", now_us + day_us)  # its window over
    any_meter.reset(subject="org-1")
    with any_meter.sql_engine.connect() as connection:
        assert not CounterStore(connection).used_in_windows_after("calls", now_us)
