"""Rejected events, kept whole by the worker's path (`apply_batch`), are
replayed once their limit exists, exactly once (SQLite and PostgreSQL;
concurrent replays from several threads). Their count of the last day:
tests/cli/test_status_cli.py and tests/telemetry/test_lag_gauges.py."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
UNKNOWN = "unknown limit 'apii': define it with `metering limits set`"


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))
        yield m


def rejected_batch(ids: list[str], cost: int = 2) -> dict[str, object]:
    return encode_batch([encode_event(make_event([("org", "apii", cost)], NOW, i)) for i in ids])


def used(meter: Meter) -> int:
    return sum(c.used for c in meter.counters("org", "apii"))


def test_replay_applies_them_once_the_limit_exists_and_only_once(meter: Meter) -> None:
    apply_batch(meter, rejected_batch(["u1", "u2"]))
    waiting = meter.replay_rejected()
    assert waiting.applied == () and waiting.waiting == (("u1", UNKNOWN), ("u2", UNKNOWN))
    assert meter.result("u1").outcome == "rejected"  # type: ignore[union-attr]

    meter.set_limit(Limit("apii", maximum=100, period="1d", window="calendar"))
    done = meter.replay_rejected()
    assert [(d.event_id, d.outcome) for d in done.applied] == [("u1", "allowed"), ("u2", "allowed")]
    assert done.waiting == ()
    assert used(meter) == 4
    assert meter.result("u1").outcome == "allowed"  # type: ignore[union-attr]
    assert meter.rejected_messages(10) == []
    results = meter.count_results()

    again = meter.replay_rejected()
    assert again.applied == () and again.waiting == ()
    report = apply_batch(meter, rejected_batch(["u1", "u2"]))  # the queue delivers them again
    assert report.duplicates == 2
    assert (used(meter), meter.count_results()) == (4, results)


def test_concurrent_replays_apply_each_event_once(meter: Meter) -> None:
    ids = [f"u{n}" for n in range(40)]
    apply_batch(meter, rejected_batch(ids, cost=1))
    meter.set_limit(Limit("apii", maximum=1000, period="1d", window="calendar"))

    def replay(_: int) -> list[str]:
        with Meter(meter.url, clock=meter.clock) as other:
            return [d.event_id or "" for d in other.replay_rejected(7).applied] + [
                d.event_id or "" for d in other.replay_rejected(100).applied
            ]

    with ThreadPoolExecutor(4) as pool:
        applied = [event_id for found in pool.map(replay, range(4)) for event_id in found]
    assert sorted(applied) == sorted(ids)
    assert used(meter) == len(ids)
    assert meter.outcome_counts() == {"allowed": len(ids)}
