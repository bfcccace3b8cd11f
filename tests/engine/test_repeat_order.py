"""One order of checks on every path: a decided id is looked up before the
event is judged acceptable.

An id reused with other charges is an `EventConflict`, and a repeat of the
same charges the stored result, even when the repeat's time is past its
limit's lateness or in the future (`OccurredAtOutOfRange` otherwise) or its
limit is gone. The paths: `Meter.consume` (the fast path; on PostgreSQL the
one-trip function first), a one-event batch (`Meter.apply`), the reference
engine directly, and a priced limit (decided by the reference engine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from decision_paths import apply_reference, without

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.domain.decisions import Decision
from metering.errors import EventConflict, OccurredAtOutOfRange
from metering.usage.results import consumed

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
Apply = Callable[[Meter, str, int, datetime], Decision]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=100, period="1h"))
        m.set_limit(Limit("priced", maximum=100, period="1h"))
        m.set_limit(spend_limit("spend", "5.00", "USD", "1mo", window="calendar"))
        m.set_price("priced", "0.01", "USD")
        yield m


def _consume(meter: Meter, limit: str, cost: int, at: datetime) -> Decision:
    return meter.consume("org-1", limit, cost, event_id="e-1", occurred_at=at)


def _batch(meter: Meter, limit: str, cost: int, at: datetime) -> Decision:
    event = make_event([("org-1", limit, cost)], at, "e-1")
    [decided] = meter.apply([event], invalid="raise")
    if isinstance(decided, EventConflict):
        raise decided
    return decided


def _reference(meter: Meter, limit: str, cost: int, at: datetime) -> Decision:
    record = make_event([("org-1", limit, cost)], at, "e-1").record()
    [answer] = apply_reference(meter._engine, [record], meter.database.now_us(), "raise", ())
    return consumed("e-1", answer)


def _old_fast_path(meter: Meter, limit: str, cost: int, at: datetime) -> Decision:
    without(meter._engine, "one_trip")
    return _consume(meter, limit, cost, at)


PATHS = [_consume, _batch, _reference, _old_fast_path]
OUT_OF_RANGE = [timedelta(days=-2), timedelta(hours=1)]


@pytest.mark.parametrize("limit", ["calls", "priced"])
@pytest.mark.parametrize("apply", PATHS)
def test_a_reused_id_out_of_range_is_a_conflict(meter: Meter, limit: str, apply: Apply) -> None:
    first = apply(meter, limit, 2, NOW)
    for offset in OUT_OF_RANGE:
        with pytest.raises(OccurredAtOutOfRange):  # a new id: the time is judged
            meter.consume("org-1", limit, 2, event_id="e-2", occurred_at=NOW + offset)
        with pytest.raises(EventConflict):
            apply(meter, limit, 5, NOW + offset)
        again = apply(meter, limit, 2, NOW + offset)
        assert (again.duplicate, again.occurred_at) == (True, first.occurred_at)
    assert sum(c.used for c in meter.counters("org-1", limit)) == 2


@pytest.mark.parametrize("apply", PATHS)
def test_a_repeat_of_an_id_whose_limit_is_gone_is_a_conflict(meter: Meter, apply: Apply) -> None:
    apply(meter, "calls", 2, NOW)
    meter.delete_limit("calls")
    with pytest.raises(EventConflict):
        apply(meter, "calls", 5, NOW)
    assert apply(meter, "calls", 2, NOW).duplicate
