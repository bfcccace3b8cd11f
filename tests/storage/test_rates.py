"""Every path that writes counters moves their rate as `metering.domain.forecast`
computes it: the same stream of events at frozen instants, decided by the
reference engine, the fast path (on SQLAlchemy's and on its own connections,
one event and batches past the bulk statements' size) and, on PostgreSQL,
the one-trip function, leaves the rate computed by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.domain.forecast import added
from metering.engine.one_trip import STATS
from metering.storage.tables import counters

START = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
LIMITS = [
    Limit("calls", maximum=1_000, period="1d", window="calendar", enforcement="soft"),
    Limit("hard", maximum=50, period="1d", window="calendar"),
]
PATHS = {
    "one_trip": ("one_trip", "direct", "connection", "reference"),
    "direct": ("direct", "connection", "reference"),
    "connection": ("connection", "reference"),
    "reference": ("reference",),
}
# (seconds to advance, cost): a give-back is not among them; the hard limit
# denies once it is spent, which adds nothing.
STREAM = [(0, 30), (60, 1), (600, 20), (1, 25), (3_600, 10), (7_200, 40), (5, 7)]


def _on_path(meter: Meter, path: str) -> Meter:
    engine = meter._engine
    engine.paths = [engine.path(name) for name in PATHS[path]]
    if path in ("connection", "reference") and engine.direct is not None:
        engine.direct.close()
        engine.direct = None
    return meter


def _rates(meter: Meter) -> dict[tuple[str, str], tuple[float, int]]:
    c = counters.c
    query = select(c.limit_name, c.subject, c.rate, c.rate_at_us)
    with meter.sql_engine.connect() as connection:
        return {(r[0], r[1]): (r[2], r[3]) for r in connection.execute(query)}


def _expected(stream: list[tuple[int, int]], maximum: int | None = None) -> tuple[float, int]:
    rate, at, used, now = 0.0, 0, 0, int(START.timestamp() * 1_000_000)
    for seconds, cost in stream:
        now += seconds * 1_000_000
        charged = cost if maximum is None or used + cost <= maximum else 0
        used += charged
        rate, at = added(rate, at, charged, now)
    return rate, at


@pytest.mark.parametrize("path", list(PATHS))
def test_one_event_at_a_time(db_url: str, path: str) -> None:
    if path == "one_trip" and not db_url.startswith("postgresql"):
        pytest.skip("the one-trip function is PostgreSQL's")
    clock = FrozenClock(START)
    before = STATS["applied"]
    with Meter(db_url, clock=clock) as meter:
        _on_path(meter, path)
        meter.set_limits(LIMITS)
        for number, (seconds, cost) in enumerate(STREAM):
            clock.advance(seconds=seconds)
            meter.consume("org-1", "calls", cost, event_id=f"calls-{number}")
            meter.consume("org-1", "hard", cost, event_id=f"hard-{number}")
        rates = _rates(meter)
    assert rates[("calls", "org-1")] == pytest.approx(_expected(STREAM), rel=1e-12)
    assert rates[("hard", "org-1")] == pytest.approx(_expected(STREAM, 50), rel=1e-12)
    if path == "one_trip":
        assert STATS["applied"] > before  # the function decided some


@pytest.mark.parametrize("path", ["reference", "connection", "direct"])
def test_batches_past_the_bulk_size(db_url: str, path: str) -> None:
    clock = FrozenClock(START)
    subjects = [f"org-{n:02}" for n in range(20)]
    with Meter(db_url, clock=clock) as meter:
        _on_path(meter, path)
        meter.set_limits(LIMITS)
        for number, (seconds, cost) in enumerate(STREAM):
            clock.advance(seconds=seconds)
            events = [
                make_event([(s, "calls", cost)], clock(), f"ev-{number}-{s}") for s in subjects
            ]
            meter.apply(events)
        rates = _rates(meter)
    for subject in subjects:
        assert rates[("calls", subject)] == pytest.approx(_expected(STREAM), rel=1e-12)


def test_a_reset_clears_the_rate(db_url: str) -> None:
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter.consume("org-1", "calls", 36)
        meter.reset("org-1", "calls")
        clock.advance(timedelta(seconds=10))
        meter.consume("org-1", "calls", 3_600)
        assert _rates(meter)[("calls", "org-1")] == (1.0, int(clock().timestamp() * 1_000_000))
