"""Rejected events, kept whole by the worker's path (`apply_batch`), are
replayed once their limit exists, exactly once (SQLite and PostgreSQL;
concurrent replays from several threads); so are those of a message the
broker gave up on (`keep_unfinished`). Their count of the last day:
tests/cli/test_status_cli.py and tests/telemetry/test_lag_gauges.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.routing import APPLY_BATCH_TASK
from metering.storage.kombu_tables import Unfinished
from metering.upkeep.dead_letters import keep_unfinished

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


# -- messages the broker gave up on (`keep_unfinished`) ---------------------------------


def unfinished(payload: object, deliveries: int = 5) -> Unfinished:
    return Unfinished(
        json.dumps({"headers": {"task": APPLY_BATCH_TASK}}), deliveries, APPLY_BATCH_TASK, payload
    )


def test_a_batch_never_finished_is_kept_rejected_and_replayed_once(meter: Meter) -> None:
    batch = encode_batch(
        [encode_event(make_event([("org", "api", 3)], NOW, i)) for i in ("n1", "n2")]
        + [{"id": "bad-1", "charges": [["org", "api", -1]]}]
    )
    assert keep_unfinished(meter.database, [unfinished(batch)]) == 2
    reason = "delivered 5 times and never finished: taken off the queue"
    assert meter.result("n1").outcome == "rejected"  # type: ignore[union-attr]
    assert meter.result("n1").reason == reason  # type: ignore[union-attr]
    letters = {(event_id, why) for event_id, why, _ in meter.rejected_messages()}
    assert (("n1", reason) in letters, ("n2", reason) in letters, len(letters)) == (True, True, 3)
    assert keep_unfinished(meter.database, [unfinished(batch)]) == 0  # kept once
    assert len(meter.rejected_messages()) == 3

    done = meter.replay_rejected()
    assert [(d.event_id, d.outcome) for d in done.applied] == [("n1", "allowed"), ("n2", "allowed")]
    assert [c.used for c in meter.counters("org", "api")] == [6]
    assert meter.replay_rejected().applied == ()
    assert [event_id for event_id, _, _ in meter.rejected_messages()] == ["bad-1"]


def test_a_decided_event_is_left_as_it_is_and_a_conflict_kept(meter: Meter) -> None:
    meter.consume("org", "api", 1, event_id="same")
    meter.consume("org", "api", 1, event_id="other")
    batch = encode_batch(
        [
            encode_event(make_event([("org", "api", 1)], NOW, "same")),
            encode_event(make_event([("org", "api", 9)], NOW, "other")),
        ]
    )
    assert keep_unfinished(meter.database, [unfinished(batch)]) == 0
    assert meter.outcome_counts() == {"allowed": 2}
    [(event_id, reason, _)] = meter.rejected_messages()
    assert event_id == "other" and "already recorded with different charges" in reason


def test_a_message_that_is_no_batch_is_kept_whole(meter: Meter) -> None:
    raw = json.dumps({"headers": {}, "body": "e30="})
    kept = [Unfinished(raw, 7, None, None), Unfinished(raw, 7, "metering.prune", None)]
    assert keep_unfinished(meter.database, kept) == 0
    why = "delivered 7 times and never finished: taken off the queue"
    assert sorted(meter.rejected_messages()) == [
        (None, f"a message that names no task: {why}", raw),
        (None, f"metering.prune: {why}", raw),
    ]


def test_two_messages_with_one_event_keep_it_once(meter: Meter) -> None:
    """The sweep gives up on several messages at once; one event in two of them
    (a producer's retry) was two rows of one id, and the transaction failed."""
    event = encode_event(make_event([("org", "api", 1)], NOW, "twice"))
    batches = [encode_batch([event]), encode_batch([event])]
    assert keep_unfinished(meter.database, [unfinished(batch) for batch in batches]) == 1
    assert meter.outcome_counts() == {"rejected": 1}
    assert [event_id for event_id, _, _ in meter.rejected_messages()] == ["twice"]
