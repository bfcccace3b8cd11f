"""A repeated event id answers its stored result, field for field, on every path.

The retry comes later (a frozen clock advanced, no sleep), without its own
``occurred_at`` (so it carries its arrival time) and with other metadata:
neither may leak into the answer. The paths: the fast path and, on
PostgreSQL, the one-trip function (a plain limit), the reference engine (a
priced limit with a spend cap, and the reference path alone), a
batch (`Meter.apply`), and `Meter.consume`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from decision_paths import apply_reference, without

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.domain.decisions import Decision
from metering.usage.results import applied_of

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
Apply = Callable[[Meter, str, str, dict[str, str]], Decision]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=100, period="1h"))
        m.set_limit(Limit("priced", maximum=100, period="1h"))
        m.set_limit(spend_limit("spend", "5.00", "USD", "1mo", window="calendar"))
        m.set_price("priced", "0.01", "USD")
        yield m


def _consume(meter: Meter, limit: str, event_id: str, metadata: dict[str, str]) -> Decision:
    return meter.consume("org-1", limit, 3, event_id=event_id, metadata=metadata)


def _batch(meter: Meter, limit: str, event_id: str, metadata: dict[str, str]) -> Decision:
    event = make_event([("org-1", limit, 3)], meter.clock(), event_id, metadata)
    [decided] = meter.apply([event], invalid="raise")
    assert isinstance(decided, Decision)
    return decided


def _reference(meter: Meter, limit: str, event_id: str, metadata: dict[str, str]) -> Decision:
    record = make_event([("org-1", limit, 3)], meter.clock(), event_id, metadata).record()
    [answer] = apply_reference(meter._engine, [record], meter.database.now_us(), "raise", ())
    decided = applied_of(event_id, answer)
    assert isinstance(decided, Decision)
    return decided


def _old_fast_path(meter: Meter, limit: str, event_id: str, metadata: dict[str, str]) -> Decision:
    without(meter._engine, "one_trip")
    return _consume(meter, limit, event_id, metadata)


@pytest.mark.parametrize("limit", ["calls", "priced"])
@pytest.mark.parametrize("apply", [_consume, _batch, _reference, _old_fast_path])
def test_a_retry_answers_the_stored_result_field_for_field(
    meter: Meter, limit: str, apply: Apply
) -> None:
    first = apply(meter, limit, "idem-1", {"try": "1"})
    meter.clock.advance(seconds=1.1)  # type: ignore[attr-defined]
    again = apply(meter, limit, "idem-1", {"try": "2"})
    assert again == replace(first, duplicate=True)
    assert again.occurred_at == NOW  # not the retry's arrival
    assert again.metadata == first.metadata == {"try": "1"}
    assert meter.result("idem-1") == first
    assert sum(c.used for c in meter.counters("org-1", limit)) == 3  # charged once
