"""A void after a reset gives back what the counter that started over still bills.

A reset and an event on one counter are ordered by which wrote first, not by
their clocks: an event decided before a reset but written after it (it waited
for the reset's lock, or its process's clock is behind) is counted in the
new window, and a void of it gives its cost back. An event written before
the reset was cleared with it, and a void gives nothing.

The clocks here are frozen, the operator's a millisecond ahead of the
worker's, so that every event the worker writes after the reset was decided
"before" it. Each engine path writes the event: the reference engine, the
fast path, `consume` (group commit; on PostgreSQL the one-trip function),
and a reservation held and committed (of a limit that is not a seat limit:
those are never reserved).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from decision_paths import apply_reference, without

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.engine.one_trip import STATS

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
LIMITS = [
    Limit("calls", maximum=100, period="1d", window="calendar"),
    Limit("bucket", maximum=100, period="1h", algorithm="token_bucket"),
    Limit("seats", maximum=5, period="1d", window="calendar", distinct="user"),
]
PATHS = ["reference", "fast", "consume", "reserve"]


def _charge(meter: Meter, path: str, event_id: str, limit: str, user: str) -> None:
    metadata = {"user": user} if limit == "seats" else None
    cost = 1 if limit == "seats" else 2
    engine = meter._engine
    if path != "consume":
        without(engine, "one_trip")
    if path == "reserve":
        held = meter.reserve("org-1", limit, cost=cost, event_id=event_id, metadata=metadata)
        assert held.allowed
        meter.commit_reservation(event_id)
        return
    record = make_event([("org-1", limit, cost)], meter.clock(), event_id, metadata).record()
    if path == "reference":
        apply_reference(engine, [record], meter.database.now_us(), "raise", ())
    elif path == "fast":
        engine.apply([record], invalid="raise")
    else:
        engine.submit(record)


def _used(meter: Meter, limit: str) -> int:
    return sum(counter.used for counter in meter.counters("org-1", limit))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("limit", ["calls", "bucket", "seats"])
def test_a_void_after_a_reset_gives_back_an_event_written_after_it(
    db_url: str, path: str, limit: str
) -> None:
    if (path, limit) == ("reserve", "seats"):
        pytest.skip("a seat limit is consumed, never reserved")
    one_trip = STATS["applied"]
    worker_clock = FrozenClock(NOW)
    operator_clock = FrozenClock(NOW + timedelta(milliseconds=1))
    with (
        Meter(db_url, clock=worker_clock) as worker,
        Meter(db_url, clock=operator_clock) as operator,
    ):
        operator.set_limits(LIMITS)
        _charge(worker, path, "before", limit, user="a")
        assert operator.reset(subject="org-1", limit=limit) == 1
        _charge(worker, path, "after", limit, user="b")
        assert _used(operator, limit) == (1 if limit == "seats" else 2)

        assert operator.void("before", "refund").charges == ()  # the reset cleared it
        gave = operator.void("after", "refund").charges
        assert [charge[2] for charge in gave] == [1 if limit == "seats" else 2]
        assert _used(operator, limit) == 0
    if db_url.startswith("postgresql") and (path, limit) == ("consume", "calls"):
        assert STATS["applied"] > one_trip  # the one-trip function wrote the events
