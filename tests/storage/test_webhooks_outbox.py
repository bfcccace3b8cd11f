"""Notifications follow state (SPEC invariant 6), on SQLite and PostgreSQL.

Written in the counters' transaction; once per window, enforced by marks in
the database; a rolled-back change leaves nothing. Time is a frozen clock.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, event, func, select

from metering import FrozenClock, Limit, Meter, make_event
from metering.domain.notifications import Notice
from metering.engine.reference import apply_events
from metering.storage.connections import run_transaction
from metering.storage.store import Store
from metering.storage.tables import webhook_deliveries, webhook_marks
from metering.storage.webhooks import WebhookStore
from metering.webhooks import Webhooks

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Any:
    with Meter(db_url, clock=clock) as meter:
        yield meter


def types_of(hooks: Webhooks) -> list[str]:
    return [message_type for _, message_type, _ in hooks.messages()]


def test_fifty_denials_one_denied_thresholds_once_then_one_reset(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(Limit("send", maximum=10, period="2m", thresholds=(80, 100)))
    hooks = Webhooks(meter)
    endpoint, _ = hooks.add("https://example.com/hooks")
    for n in range(10):
        meter.consume("visitor-1", "send", event_id=f"ok-{n}")
    for n in range(50):
        assert not meter.consume("visitor-1", "send", event_id=f"no-{n}").allowed
    # A batch through the worker's path adds more denials in the same window.
    meter.apply([make_event([("visitor-1", "send", 1)], NOW, f"batch-{n}") for n in range(5)])
    assert sorted(types_of(hooks)) == ["limit.denied", "limit.threshold", "limit.threshold"]
    messages = {t: json.loads(p) for _, t, p in hooks.messages()}
    denied = messages["limit.denied"]["data"]
    assert denied["event_id"] == "no-0" and denied["used"] == 10 and denied["maximum"] == 10
    assert denied["retry_at"] == denied["resets_at"] == "2026-11-22T12:02:00Z"
    thresholds = sorted(
        json.loads(p)["data"]["threshold"] for _, _, p in hooks.messages("limit.threshold")
    )
    assert thresholds == [80, 100]
    assert len(hooks.deliveries(endpoint_id=endpoint.id)) == 3

    assert hooks.sweep_resets() == 0  # the window is not over yet
    clock.advance(minutes=2)
    assert hooks.sweep_resets() == 1
    assert hooks.sweep_resets() == 0
    [(_, _, reset)] = hooks.messages("limit.reset")
    data = json.loads(reset)["data"]
    assert (data["subject"], data["limit"], data["window_end"]) == (
        "visitor-1",
        "send",
        "2026-11-22T12:02:00Z",
    )
    # The fresh window denies again: one more limit.denied, thresholds again.
    for n in range(12):
        meter.consume("visitor-1", "send", event_id=f"new-{n}")
    assert types_of(hooks).count("limit.denied") == 2
    assert types_of(hooks).count("limit.threshold") == 4


def test_a_soft_limit_exceeds_once_per_window(meter: Meter) -> None:
    meter.set_limit(Limit("org", maximum=3, period="1h", window="calendar", enforcement="soft"))
    hooks = Webhooks(meter)
    for n in range(8):
        meter.consume("org-1", "org", event_id=f"e-{n}")
    assert types_of(hooks) == ["limit.exceeded"]
    assert json.loads(hooks.messages()[0][2])["data"]["used"] == 4


def test_a_token_bucket_denies_once_per_episode_until_it_is_full_again(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(Limit("api", maximum=2, period="10s", algorithm="token_bucket"))
    hooks = Webhooks(meter)
    for n in range(6):
        meter.consume("u1", "api", event_id=f"a-{n}")
    assert types_of(hooks) == ["limit.denied"]
    clock.advance(seconds=5)  # half refilled: not full, the episode goes on
    assert hooks.sweep_resets() == 0
    meter.consume("u1", "api", event_id="b-0")
    meter.consume("u1", "api", event_id="b-1")
    assert types_of(hooks) == ["limit.denied"]
    clock.advance(seconds=10)
    assert hooks.sweep_resets() == 1
    for n in range(3):
        meter.consume("u1", "api", event_id=f"c-{n}")
    assert sorted(types_of(hooks)) == ["limit.denied", "limit.denied", "limit.reset"]


def test_only_enabled_endpoints_subscribed_to_the_type_get_a_delivery(meter: Meter) -> None:
    meter.set_limit(Limit("send", maximum=1, period="1m", thresholds=(100,)))
    hooks = Webhooks(meter)
    everything, _ = hooks.add("https://a.example/hooks")
    only_denied, _ = hooks.add("https://b.example/hooks", types=["limit.denied"])
    off, _ = hooks.add("https://c.example/hooks")
    hooks.set_enabled(off.id, False)
    meter.consume("s", "send")
    meter.consume("s", "send")
    assert sorted(d.message_type for d in hooks.deliveries(endpoint_id=everything.id)) == [
        "limit.denied",
        "limit.threshold",
    ]
    assert [d.message_type for d in hooks.deliveries(endpoint_id=only_denied.id)] == [
        "limit.denied"
    ]
    assert hooks.deliveries(endpoint_id=off.id) == []


def test_a_rolled_back_counter_change_writes_no_notification(meter: Meter) -> None:
    meter.set_limit(Limit("send", maximum=1, period="1m", thresholds=(100,)))
    hooks = Webhooks(meter)
    hooks.add("https://example.com/hooks")
    now_us = int(NOW.timestamp() * 1_000_000)
    events = [make_event([("s", "send", 1)], NOW, f"e-{n}") for n in range(3)]

    class Boom(Exception):
        pass

    def work(connection: Any) -> None:
        decided = apply_events(Store(connection), events, now_us)
        assert [d.outcome for d in decided] == ["allowed", "denied", "denied"]  # type: ignore[union-attr]
        assert len(WebhookStore(connection).messages()) == 2  # written, inside the transaction
        raise Boom

    with pytest.raises(Boom):
        run_transaction(meter.sql_engine, work)
    assert hooks.messages() == [] and hooks.deliveries() == []
    marks = select(func.count()).select_from(webhook_marks)
    assert run_transaction(meter.sql_engine, lambda c: c.execute(marks).scalar_one()) == 0
    assert meter.counters() == [] or all(c.used == 0 for c in meter.counters())
    # Applied for real afterwards, the notifications are there, once.
    meter.apply(events)
    assert sorted(types_of(hooks)) == ["limit.denied", "limit.threshold"]


def _denied(subject: str, mark: str = "denied") -> Notice:
    return Notice(
        type="limit.denied",
        mark=mark,
        limit="send",
        subject=subject,
        maximum=10,
        used=10,
        window_start_us=1_000,
        window_end_us=2_000,
        resets_at_us=2_000,
        retry_at_us=2_000,
        event_id=f"e-{subject}",
    )


def test_a_batch_of_notices_writes_each_new_mark_once_in_a_few_statements(
    meter: Meter,
) -> None:
    """More notices than one insert of SQLAlchemy's takes: a mark stored before and a repeated
    one in the batch write nothing; every other notice its mark, its message
    (the first document of its mark) and a delivery; the ids come back in the
    batch's order; the statements do not grow with the batch."""
    hooks = Webhooks(meter)
    hooks.add("https://example.com/hooks")
    count = 1_050  # past the 1,000 rows SQLAlchemy puts in one multi-row insert
    meter.database.run(lambda c: WebhookStore(c).record_notices([(_denied("s-0"), {"n": -1})], 5))
    batch = [(_denied(f"s-{i}"), {"n": i}) for i in range(count)]
    batch += [(_denied("s-3"), {"n": "again"}), (_denied("s-3", "would_deny"), {"n": "kind"})]
    statements: list[str] = []

    def counted(*args: Any) -> None:
        statements.append(args[2])

    def record(connection: Connection) -> list[str]:
        event.listen(connection, "before_cursor_execute", counted)
        try:
            return WebhookStore(connection).record_notices(batch, 6)
        finally:
            event.remove(connection, "before_cursor_execute", counted)

    written = meter.database.run(record)
    payloads = {message_id: json.loads(p)["n"] for message_id, _, p in hooks.messages()}
    assert [payloads[message_id] for message_id in written] == [*range(1, count), "kind"]
    assert len(payloads) == count + 1 and "again" not in payloads.values()
    for table in (webhook_marks, webhook_deliveries):
        rows = select(func.count()).select_from(table)
        assert meter.database.run(lambda c, rows=rows: c.execute(rows).scalar_one()) == count + 1
    assert len(statements) <= 8, len(statements)
