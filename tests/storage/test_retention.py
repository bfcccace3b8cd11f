"""Retention removes exactly what is old enough, and never a result inside the
redelivery horizon (SQLite and PostgreSQL, frozen clock)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, insert, select

from metering import FrozenClock, Limit, Meter, make_event
from metering.domain.instants import to_us
from metering.errors import InvalidInput
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.settings import RetentionPolicy
from metering.storage.tables import (
    webhook_attempts,
    webhook_deliveries,
    webhook_marks,
    webhook_messages,
)
from metering.upkeep.retention import prune, redelivery_horizon_us

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
VISIBILITY = 300.0


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("api", maximum=1000, period="1h", lateness="1d"))
        yield m


def consume_at(meter: Meter, clock: FrozenClock, at: datetime, ids: list[str]) -> None:
    clock.set(at)
    for event_id in ids:
        meter.consume("org", "api", event_id=event_id)


def counts(meter: Meter) -> dict[str, int]:
    with meter.sql_engine.connect() as connection:
        return {
            table.name: connection.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (webhook_messages, webhook_deliveries, webhook_attempts, webhook_marks)
        }


def test_results_older_than_the_age_go_and_the_rest_stay(meter: Meter, clock: FrozenClock) -> None:
    consume_at(meter, clock, T0, ["old-1", "old-2"])
    consume_at(meter, clock, T0 + timedelta(days=9), ["young-1"])
    clock.set(T0 + timedelta(days=10))
    policy = RetentionPolicy(results_days=5)

    dry = prune(meter, policy, visibility_timeout_seconds=VISIBILITY, dry_run=True)
    assert {p.table: p.rows for p in dry}["results"] == 2
    assert meter.decided(["old-1", "old-2", "young-1"]) == {"old-1", "old-2", "young-1"}

    done = prune(meter, policy, visibility_timeout_seconds=VISIBILITY)
    assert {p.table: p.rows for p in done}["results"] == 2
    assert meter.decided(["old-1", "old-2", "young-1"]) == {"young-1"}


def test_no_result_inside_the_redelivery_horizon_is_deleted_whatever_the_age(
    meter: Meter, clock: FrozenClock
) -> None:
    horizon_us = redelivery_horizon_us(meter, VISIBILITY)
    # One day of lateness, five minutes of clock tolerance, the visibility
    # timeout and a day of producer retries.
    assert horizon_us == to_us(T0 + timedelta(days=2, minutes=5, seconds=300)) - to_us(T0)
    now = T0 + timedelta(days=3)
    just_inside = now - timedelta(microseconds=horizon_us - 1)
    just_outside = now - timedelta(microseconds=horizon_us + 1)
    consume_at(meter, clock, just_outside, ["outside"])
    consume_at(meter, clock, just_inside, ["inside"])
    clock.set(now)

    prune(meter, RetentionPolicy(results_days=0.001), visibility_timeout_seconds=VISIBILITY)

    assert meter.decided(["outside", "inside"]) == {"inside"}


def test_a_pruned_event_delivered_again_is_not_charged_again(
    meter: Meter, clock: FrozenClock
) -> None:
    """Past the horizon the event is older than any limit's lateness: a late
    redelivery is recorded as rejected, and the counter does not move."""
    consume_at(meter, clock, T0, ["e-1"])
    clock.set(T0 + timedelta(days=3))
    prune(meter, RetentionPolicy(results_days=0.001), visibility_timeout_seconds=VISIBILITY)
    assert meter.decided(["e-1"]) == set()

    event = make_event([("org", "api", 1)], T0, "e-1")
    report = apply_batch(meter, encode_batch([encode_event(event)]))

    assert report.rejected == 1
    assert sum(c.used for c in meter.counters("org", "api")) == 1


def test_dead_letters_go_after_their_own_age(meter: Meter, clock: FrozenClock) -> None:
    apply_batch(meter, {"not": "a batch"})
    clock.set(T0 + timedelta(days=2))
    apply_batch(meter, ["also not a batch"])
    clock.set(T0 + timedelta(days=3))
    prune(meter, RetentionPolicy(rejected_days=2.5), visibility_timeout_seconds=VISIBILITY)
    [(_, reason, raw)] = meter.rejected_messages()
    assert "also not a batch" in raw, reason


def add_delivery(
    meter: Meter, message_id: str, status: str, at: datetime, *, attempts: int = 1
) -> None:
    at_us = to_us(at)
    with meter.sql_engine.begin() as connection:
        connection.execute(
            insert(webhook_messages).values(
                id=message_id, type="limit.denied", payload="{}", created_at_us=at_us
            )
        )
        delivery_id = connection.execute(
            insert(webhook_deliveries)
            .values(
                message_id=message_id,
                endpoint_id="ep_1",
                status=status,
                attempts=attempts,
                created_at_us=at_us,
                updated_at_us=at_us,
            )
            .returning(webhook_deliveries.c.id)
        ).scalar_one()
        for n in range(attempts):
            connection.execute(
                insert(webhook_attempts).values(
                    delivery_id=delivery_id, attempt=n + 1, attempted_at_us=at_us, duration_ms=5
                )
            )


def add_mark(meter: Meter, subject: str, window_end: datetime, *, due: bool = False) -> None:
    end_us = to_us(window_end)
    with meter.sql_engine.begin() as connection:
        connection.execute(
            insert(webhook_marks).values(
                limit_name="api",
                subject=subject,
                window_start_us=end_us - 3_600_000_000,
                kind="denied",
                window_end_us=end_us,
                maximum=1000,
                created_at_us=end_us,
                due_at_us=end_us if due else None,
            )
        )


def test_settled_webhook_records_go_after_their_age_and_pending_ones_stay(
    meter: Meter, clock: FrozenClock
) -> None:
    add_delivery(meter, "msg_old_delivered", "delivered", T0, attempts=2)
    add_delivery(meter, "msg_old_failed", "failed", T0, attempts=3)
    add_delivery(meter, "msg_old_pending", "pending", T0)
    add_delivery(meter, "msg_young", "delivered", T0 + timedelta(days=20))
    add_mark(meter, "old", T0)
    add_mark(meter, "old-but-due", T0, due=True)
    add_mark(meter, "young", T0 + timedelta(days=20))
    clock.set(T0 + timedelta(days=31))
    before = counts(meter)
    assert before == {
        "webhook_messages": 4,
        "webhook_deliveries": 4,
        "webhook_attempts": 7,
        "webhook_marks": 3,
    }

    dry = prune(meter, RetentionPolicy(), visibility_timeout_seconds=VISIBILITY, dry_run=True)
    assert counts(meter) == before
    done = prune(meter, RetentionPolicy(), visibility_timeout_seconds=VISIBILITY)

    expected = {"webhook_deliveries": 2, "webhook_messages": 2, "webhook_marks": 1}
    assert {p.table: p.rows for p in done if p.table in expected} == expected
    # The dry run counts messages whose deliveries are still there: none yet.
    assert {p.table: p.rows for p in dry}["webhook_deliveries"] == 2
    assert counts(meter) == {
        "webhook_messages": 2,
        "webhook_deliveries": 2,
        "webhook_attempts": 2,
        "webhook_marks": 2,
    }


def test_deleting_runs_in_chunks(meter: Meter, clock: FrozenClock) -> None:
    consume_at(meter, clock, T0, [f"c-{n}" for n in range(25)])
    clock.set(T0 + timedelta(days=10))
    done = prune(
        meter, RetentionPolicy(results_days=5), visibility_timeout_seconds=VISIBILITY, chunk=7
    )
    assert {p.table: p.rows for p in done}["results"] == 25
    assert meter.count_results() == 0


@pytest.mark.parametrize("days", [0, -1, float("nan"), float("inf"), 1e300, True])
def test_a_retention_that_is_not_a_number_of_days_is_refused(days: float) -> None:
    with pytest.raises(InvalidInput):
        RetentionPolicy(results_days=days)


def test_the_cli_shows_what_would_go_then_deletes_it(
    db_url: str, meter: Meter, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from metering.cli import main

    consume_at(meter, clock, datetime.now(UTC) - timedelta(days=500), ["ancient"])
    consume_at(meter, clock, datetime.now(UTC), ["recent"])
    dry = CliRunner().invoke(main, ["--database", db_url, "prune", "--dry-run", "--format", "json"])
    assert dry.exit_code == 0, dry.output
    tables = {t["table"]: t["rows"] for t in json.loads(dry.output)["tables"]}
    assert tables["results"] == 1 and meter.decided(["ancient"]) == {"ancient"}

    done = CliRunner().invoke(main, ["--database", db_url, "prune"])
    assert done.exit_code == 0 and "deleted" in done.output, done.output
    assert meter.decided(["ancient", "recent"]) == {"recent"}

    monkeypatch.setenv("METERING_RETAIN_RESULTS_DAYS", "nan")
    bad = CliRunner().invoke(main, ["--database", db_url, "prune"])
    assert bad.exit_code == 1 and bad.output.startswith("error: ")
    assert len(bad.output.strip().splitlines()) == 1


def test_corrections_go_with_the_results_they_correct(sqlite_url: str) -> None:
    from datetime import UTC, datetime

    from metering import FrozenClock, Limit, Meter
    from metering.settings import RetentionPolicy
    from metering.upkeep.retention import prune

    clock = FrozenClock(datetime(2026, 1, 1, tzinfo=UTC))
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1d"))
        meter.consume("org", "calls", event_id="old")
        meter.void("old", "recorded twice")
        clock.advance(days=20)
        meter.consume("org", "calls", event_id="new")
        meter.void("new", "recorded twice")
        policy = RetentionPolicy(results_days=10)
        done = {p.table: p.rows for p in prune(meter, policy, visibility_timeout_seconds=300)}
        assert (done["results"], done["corrections"]) == (1, 1)
        assert [c.event_id for c in meter.corrections()] == ["new"]


def test_rollups_go_with_the_results_hour_by_hour(meter: Meter, clock: FrozenClock) -> None:
    """A rollup hour goes once it is wholly older than the results' cut-off, in chunks."""
    from metering.reports import usage_by_dimension_report

    meter.set_limit(Limit("routed", maximum=1000, period="1h", dimensions=("route",)))
    for hours, route in ((0, "/old"), (1, "/old-too"), (2, "/old-3"), (24 * 9, "/young")):
        clock.set(T0 + timedelta(hours=hours))
        meter.consume("org", "routed", metadata={"route": route})
    # The cut-off falls 30 minutes into the third hour: that hour stays.
    clock.set(T0 + timedelta(days=10, hours=2, minutes=30))
    policy = RetentionPolicy(results_days=10)

    dry = prune(meter, policy, visibility_timeout_seconds=VISIBILITY, dry_run=True)
    assert {p.table: p.rows for p in dry}["usage_rollups"] == 2
    done = prune(meter, policy, visibility_timeout_seconds=VISIBILITY, chunk=1)
    assert {p.table: p.rows for p in done}["usage_rollups"] == 2
    left = usage_by_dimension_report(meter, subject="org", key="route")
    assert sorted(r.value or "" for r in left) == ["/old-3", "/young"]


def test_a_delivery_replayed_while_prune_runs_is_not_deleted(pg_url: str) -> None:
    """Prune picks settled deliveries; a replay commits before its delete."""
    from sqlalchemy import event

    from metering.webhooks import Webhooks

    clock = FrozenClock(T0)
    with Meter(pg_url, clock=clock) as meter, Meter(pg_url, clock=clock) as other:
        add_delivery(meter, "msg_failed", "failed", T0, attempts=2)
        with meter.sql_engine.connect() as connection:
            [delivery_id] = connection.execute(select(webhook_deliveries.c.id)).scalars()
        clock.set(T0 + timedelta(days=31))
        replayed: list[int] = []

        def replay_first(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            if not replayed and statement.lstrip().upper().startswith("DELETE FROM WEBHOOK_"):
                replayed.append(Webhooks(other).replay([delivery_id]))

        event.listen(meter.sql_engine, "before_cursor_execute", replay_first)
        prune(meter, RetentionPolicy(), visibility_timeout_seconds=VISIBILITY)
        assert replayed == [1]
        with meter.sql_engine.connect() as connection:
            status = connection.execute(select(webhook_deliveries.c.status)).scalars().all()
            attempts = connection.execute(select(func.count()).select_from(webhook_attempts))
            assert (status, attempts.scalar_one()) == (["pending"], 2)


def test_a_late_event_after_a_void_does_not_notify_the_window_again(db_url: str) -> None:
    """A window's marks stay as long as events may still arrive for it."""
    clock = FrozenClock(T0)
    with Meter(db_url, clock=clock) as meter:
        soft = Limit(
            "late", maximum=5, period="1d", window="calendar", enforcement="soft", lateness="60d"
        )
        meter.set_limit(soft)
        meter.consume("org", "late", cost=6, event_id="over")
        assert exceeded_messages(meter) == 1
        clock.advance(days=40)
        prune(meter, RetentionPolicy(webhooks_days=30), visibility_timeout_seconds=VISIBILITY)
        assert exceeded_messages(meter) == 0  # the message went; its window's mark stays
        meter.void("over", "refund", horizon_seconds=50 * 86_400)
        late = meter.consume("org", "late", cost=6, event_id="late", occurred_at=T0)
        assert late.outcome == "overage"
        assert exceeded_messages(meter) == 0


def exceeded_messages(meter: Meter) -> int:
    with meter.sql_engine.connect() as connection:
        query = select(func.count()).where(webhook_messages.c.type == "limit.exceeded")
        return int(connection.execute(query).scalar_one())
