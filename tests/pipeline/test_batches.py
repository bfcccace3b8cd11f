"""Applying one queued message (`metering/pipeline/batches.py`) on both
databases: each event decoded again and applied in order, what it did
counted (applied, duplicates, conflicts, rejected for an unknown limit,
malformed input kept as a dead letter); a redelivered message changes
nothing twice, and one delivered too many times is kept rejected; the
garbage collector is paused only while a batch runs.
(The database's refusals split around: tests/storage/test_rejected.py.)"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, make_event
from metering.pipeline.batches import BatchReport, apply_batch, apply_delivered
from metering.pipeline.messages import encode_batch, encode_event

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=3, period="1h", window="calendar"))
        yield meter


def message(*charges: tuple[str, str, int, str]) -> object:
    events = [make_event([(s, limit, cost)], NOW, event_id) for s, limit, cost, event_id in charges]
    return encode_batch([encode_event(event) for event in events])


def test_a_batch_is_applied_in_order_and_what_it_did_counted(meter: Meter) -> None:
    meter.consume("org", "calls", event_id="before")
    payload = message(
        ("org", "calls", 1, "a"),
        ("org", "calls", 1, "before"),  # decided before: a duplicate
        ("org", "calls", 2, "a"),  # the same id, other charges: a conflict
        ("org", "nope", 1, "typo"),  # an unknown limit: a rejected result
        ("org", "calls", 2, "denied"),  # 2 used of 3: denied, still applied
    )
    report = apply_batch(meter, payload)
    assert report == BatchReport(applied=2, duplicates=1, conflicts=1, rejected=1)
    assert report.to_dict() == {
        "applied": 2,
        "duplicates": 1,
        "conflicts": 1,
        "rejected": 1,
        "malformed": 0,
    }
    assert meter.result("denied").outcome == "denied"  # type: ignore[union-attr]
    assert meter.result("typo").outcome == "rejected"  # type: ignore[union-attr]


def test_a_redelivered_batch_changes_nothing_twice(meter: Meter) -> None:
    payload = message(("org", "calls", 1, "a"), ("org", "calls", 1, "b"))
    assert apply_batch(meter, payload).applied == 2
    again = apply_batch(meter, payload)
    assert (again.applied, again.duplicates) == (0, 2)
    assert sum(c.used for c in meter.counters("org", "calls")) == 2


def test_input_that_is_no_event_is_kept_as_a_dead_letter(meter: Meter) -> None:
    assert apply_batch(meter, {"v": 1, "events": "many"}).malformed == 1
    assert apply_batch(meter, [1, 2]).malformed == 1
    assert len(meter.rejected_messages()) == 2
    assert meter.count_results() == 0


def test_the_collector_is_paused_only_while_a_batch_runs(meter: Meter) -> None:
    seen: list[bool] = []
    real = meter.apply_records

    def watched(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    meter.apply_records = watched  # type: ignore[method-assign]
    assert gc.isenabled()
    apply_batch(meter, message(("org", "calls", 1, "a")))
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        apply_batch(meter, message(("org", "calls", 1, "b")))
        assert not gc.isenabled()  # left off, as it was
    finally:
        gc.enable()


# -- a message delivered again (`apply_delivered`) ----------------------------------


def test_a_message_delivered_fewer_times_than_the_bound_is_applied(meter: Meter) -> None:
    payload = message(("org", "calls", 1, "a"), ("org", "calls", 1, "b"))
    assert apply_delivered(meter, payload, 0, max_deliveries=2) == BatchReport(applied=2)
    assert apply_delivered(meter, payload, 1, max_deliveries=2) == BatchReport(duplicates=2)
    assert meter.outcome_counts() == {"allowed": 2}


def test_a_message_at_the_bound_is_kept_and_what_was_decided_left(meter: Meter) -> None:
    """Applied in part before its worker died: the decided id stays as it is."""
    meter.consume("org", "calls", event_id="a")
    payload = message(("org", "calls", 1, "a"), ("org", "calls", 1, "b"))
    assert apply_delivered(meter, payload, 2, max_deliveries=2) == BatchReport(rejected=1)
    reason = "delivered 2 times and never finished: taken off the queue"
    assert meter.result("b").reason == reason  # type: ignore[union-attr]
    assert meter.outcome_counts() == {"allowed": 1, "rejected": 1}
    assert [(e, r) for e, r, _ in meter.rejected_messages()] == [("b", reason)]
    [replayed] = meter.replay_rejected().applied
    assert (replayed.event_id, replayed.outcome) == ("b", "allowed")
