"""`metering.upkeep.audit` on both databases: a ledger after real traffic proves
itself; a database corrupted on purpose is named, invariant by invariant;
an incremental run reads only what came since the last one."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import delete, select, update

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.audit import INVARIANTS, Invariant
from metering.pipeline.batches import apply_batch
from metering.pipeline.producer import UsageProducer
from metering.pipeline.routing import AUDIT_TASK, DEFAULT_QUEUE
from metering.settings import RetentionPolicy, Settings
from metering.storage.tables import (
    counters,
    distinct_values,
    grants,
    results,
    webhook_messages,
)
from metering.telemetry.lag import lag_collector
from metering.telemetry.metrics import exposition_registry
from metering.upkeep.audit import AuditOptions, last_report, run_audit
from metering.upkeep.retention import prune
from workers import tasks
from workers.app import create_app

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("calls", maximum=100, period="1mo", window="calendar"))
        m.set_limit(Limit("burst", maximum=5, period="1h"))
        m.set_limit(Limit("chat", maximum=10, period="1d", window="calendar", enforcement="soft"))
        m.set_limit(Limit("trial", maximum=2, period="1d", window="calendar", enforcement="shadow"))
        m.set_limit(Limit("api", maximum=10, period="10s", algorithm="token_bucket"))
        m.set_limit(spend_limit("spend", "5.00", "USD", "1mo", window="calendar"))
        m.set_limit(Limit("seats", maximum=2, period="1mo", window="calendar", distinct="user"))
        m.set_limit(Limit("disk", maximum=50, period="1mo", window="calendar", aggregation="max"))
        m.set_limit(Limit("cad", maximum=2, algorithm="concurrent"))
        m.set_price("calls", "0.01", "USD")
        yield m


def traffic(meter: Meter, clock: FrozenClock) -> None:
    """Consumes, denials, a stacked event, voids, reservations cancelled,
    committed and settled for more, a grant drawn, a reset, priced events."""
    for i in range(6):
        meter.consume("org-1", "burst", 1, event_id=f"b{i}")  # the 6th is denied
    meter.consume(charges=[("org-1", "calls", 3), ("org-1", "chat", 4)], event_id="s1")
    meter.consume("org-2", "chat", 15, event_id="soft")
    meter.consume("org-2", "trial", 3, event_id="shadow")
    meter.consume("org-2", "api", 4, event_id="bucket")
    meter.void("s1", "refund")
    meter.grant("org-3", "burst", 4, grant_id="g1")
    for i in range(7):
        meter.consume("org-3", "burst", 1, event_id=f"g{i}")  # 5 own, 2 from the grant
    meter.void("g6", "mistake")
    with meter.reserve("org-4", "calls", 10, event_id="r-cancel") as held:
        held.cancel()
    meter.reserve("org-4", "calls", 7, event_id="r-commit").commit()
    meter.reserve("org-5", "burst", 2, event_id="r-more", ttl_seconds=60)
    meter.commit_reservation("r-more", actual=9)  # 3 past the maximum: overdraft
    meter.consume("org-6", "calls", 20, event_id="p1")
    meter.reset("org-6", "calls")
    meter.consume("org-6", "calls", 5, event_id="p2")
    for i, user in enumerate(["ann", "bob", "ann", "cy"]):  # a repeat is free; cy is denied
        meter.consume("org-7", "seats", 1, event_id=f"seat{i}", metadata={"user": user})
    meter.void("seat1", "left")
    for i, level in enumerate([20, 40, 30]):
        meter.consume("org-7", "disk", level, event_id=f"disk{i}")
    meter.void("disk1", "wrong reading")
    meter.checkout("org-7", "cad", 1)
    for _ in range(3):
        meter.lease("org-8", "calls", 1)  # a lease reserves a block, settled below
    meter.settle_leases(everything=True)
    clock.advance(minutes=5)
    meter.consume("org-6", "calls", 1, event_id="p3")


def found(report: object) -> set[tuple[str, str | None, str | None]]:
    return {(v.invariant.value, v.subject, v.limit) for v in report.violations}  # type: ignore[attr-defined]


def test_a_clean_ledger_after_real_traffic_proves_itself(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    report = run_audit(meter, full=True)
    assert report.violations == ()
    assert report.windows >= 8
    clock.advance(minutes=2)
    meter.consume("org-1", "calls", 2, event_id="later")
    again = run_audit(meter)
    assert (again.full, again.violations) == (False, ())
    assert again.windows < report.windows  # only what the traffic touched
    assert last_report(meter)["counts"] == {i.value: 0 for i in Invariant}  # type: ignore[index]


def corrupt(meter: Meter, statement: object) -> None:
    with meter.database.engine.begin() as connection:
        connection.execute(statement)  # type: ignore[call-overload]


def test_a_counter_edited_by_hand_is_named(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    assert run_audit(meter).violations == ()
    c = counters.c
    corrupt(
        meter, update(counters).where(c.subject == "org-1", c.limit_name == "burst").values(used=4)
    )
    clock.advance(minutes=2)
    report = run_audit(meter, full=True)
    [violation] = report.violations
    assert (violation.invariant, violation.subject, violation.limit) == (
        Invariant.COUNTER_LEDGER,
        "org-1",
        "burst",
    )
    assert (violation.expected, violation.found) == ("used 5", "used 4")


def test_a_hard_counter_past_its_maximum_is_named_twice(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    c = counters.c
    corrupt(
        meter, update(counters).where(c.subject == "org-1", c.limit_name == "burst").values(used=9)
    )
    assert found(run_audit(meter)) == {
        ("counter_ledger", "org-1", "burst"),
        ("hard_maximum", "org-1", "burst"),
    }


def test_a_deleted_result_is_named(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    corrupt(meter, delete(results).where(results.c.event_id.in_(["b2", "r-commit"])))
    assert found(run_audit(meter, full=True)) == {
        ("counter_ledger", "org-1", "burst"),
        ("counter_ledger", "org-4", "calls"),
        ("spend_priced", "org-4", "spend"),
        ("rollup_ledger", "org-4", "calls"),  # its money in the spend report
        ("one_result", None, None),
    }


def seats(meter: Meter, users: list[str | int], prefix: str) -> None:
    for n, user in enumerate(users):
        meter.consume("org-7", "seats", metadata={"user": user}, event_id=f"{prefix}{n}")


def test_a_clean_seat_ledger_with_voids_and_a_reset_proves_itself(
    meter: Meter, clock: FrozenClock
) -> None:
    seats(meter, ["ann", "bob", "ann", "cy"], "t")  # cy is denied: 2 seats
    meter.void("t0", "test")  # ann still has t2: her seat stays
    meter.void("t1", "left")  # bob's last: his seat is free
    seats(meter, ["cy", 7], "u")
    clock.advance(minutes=2)
    assert run_audit(meter).violations == ()
    meter.reset("org-7", "seats")
    seats(meter, ["ann", "bob"], "v")
    meter.void("t2", "after the reset")  # cleared: frees nothing
    clock.advance(minutes=2)
    assert run_audit(meter).violations == ()
    assert run_audit(meter, full=True).violations == ()


def test_a_seat_value_deleted_behind_the_engines_back_is_named(
    meter: Meter, clock: FrozenClock
) -> None:
    seats(meter, ["ann", "bob", "ann"], "t")
    clock.advance(minutes=2)
    assert run_audit(meter).violations == ()
    corrupt(meter, delete(distinct_values).where(distinct_values.c.value == "ann"))
    seats(meter, ["bob"], "u")  # touches the window: the next run judges it
    [count] = run_audit(meter).violations
    assert (count.invariant, count.subject, count.limit) == (Invariant.SEAT_HELD, "org-7", "seats")
    assert (count.expected, count.found) == ("used 1 (values holding a seat)", "used 2")
    full = run_audit(meter, full=True).violations
    assert [(v.invariant, v.found, v.item) for v in full] == [
        (Invariant.SEAT_HELD, "used 2", None),
        (Invariant.SEAT_HELD, "no seat", full[1].item),
    ]
    assert full[1].item in {"t0", "t2"}  # an event of ann's


def test_an_event_allowed_for_a_value_holding_no_seat_is_named(
    meter: Meter, clock: FrozenClock
) -> None:
    seats(meter, ["ann"], "t")
    clock.advance(minutes=2)
    assert run_audit(meter).violations == ()
    seats(meter, ["dee"], "u")
    # As if decided free on a stale belief that dee held a seat: cost 0, no row, no seat.
    r = results.c
    with meter.database.engine.begin() as connection:
        text = connection.execute(select(r.charges).where(r.event_id == "u0")).scalar_one()
        charges = json.loads(text)
        charges[0][2] = 0
        connection.execute(
            update(results).where(r.event_id == "u0").values(charges=json.dumps(charges))
        )
        connection.execute(delete(distinct_values).where(distinct_values.c.value == "dee"))
        connection.execute(update(counters).where(counters.c.limit_name == "seats").values(used=1))
    [violation] = run_audit(meter).violations
    assert (violation.invariant, violation.item) == (Invariant.SEAT_HELD, "u0")
    assert violation.expected == "value 'dee' holds a seat (a live event counts it)"


def test_a_seat_counter_edited_by_hand_is_named(meter: Meter, clock: FrozenClock) -> None:
    seats(meter, ["ann", "bob"], "t")
    meter.void("t1", "left")
    c = counters.c
    corrupt(meter, update(counters).where(c.limit_name == "seats").values(used=2))
    assert found(run_audit(meter)) == {
        ("counter_ledger", "org-7", "seats"),
        ("seat_held", "org-7", "seats"),
    }


def test_a_grant_pushed_below_zero_is_named(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    corrupt(meter, update(grants).where(grants.c.grant_id == "g1").values(amount=0, used=0))
    [violation] = run_audit(meter, full=True).violations
    assert (violation.invariant, violation.item) == (Invariant.GRANT_BALANCE, "g1")
    assert violation.found == "used 0, balance -1"


def test_a_spend_counter_edited_is_named(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    c = counters.c
    corrupt(
        meter, update(counters).where(c.subject == "org-6", c.limit_name == "spend").values(used=1)
    )
    [violation] = run_audit(meter, full=True).violations
    assert (violation.invariant, violation.subject, violation.limit) == (
        Invariant.SPEND_PRICED,
        "org-6",
        "spend",
    )


def test_a_spend_charge_that_is_not_its_prices_is_named(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org-7", "calls", 30, event_id="priced")
    with meter.database.engine.begin() as connection:
        text = connection.execute(select(results.c.charges).where(results.c.event_id == "priced"))
        charges = json.loads(text.scalar_one())
        charges[0][13][1] = 31  # the calls charge's amount, in cents
        connection.execute(
            update(results)
            .where(results.c.event_id == "priced")
            .values(charges=json.dumps(charges))
        )
    violation, rollup = run_audit(meter).violations
    assert (violation.invariant, violation.item) == (Invariant.SPEND_PRICED, "priced")
    assert (violation.expected, violation.found) == ("31 USD priced", "30 charged")
    assert (rollup.invariant, rollup.subject, rollup.limit) == (
        Invariant.ROLLUP_LEDGER,
        "org-7",
        "calls",
    )
    assert (rollup.expected, rollup.found) == (
        "$spend 'USD': used 31, events 1",
        "$spend 'USD': used 30, events 1",
    )


def test_a_reservation_held_past_its_ttl_is_named(meter: Meter, clock: FrozenClock) -> None:
    meter.reserve("org-8", "calls", 1, event_id="forgotten", ttl_seconds=30)
    options = AuditOptions(sweep_seconds=10)
    clock.advance(seconds=35)
    assert run_audit(meter, options=options).violations == ()  # the sweep may not have run
    clock.advance(seconds=10)
    [violation] = run_audit(meter, options=options).violations
    assert (violation.invariant, violation.item) == (Invariant.RESERVATION_UNRESOLVED, "forgotten")
    meter.sweep_reservations()
    assert run_audit(meter, options=options).violations == ()


def test_a_run_that_finds_something_writes_one_webhook(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org-1", "burst", 2, event_id="one")
    c = counters.c
    corrupt(meter, update(counters).where(c.subject == "org-1").values(used=3))
    run_audit(meter)
    with meter.database.engine.begin() as connection:
        rows = connection.execute(
            select(webhook_messages.c.payload).where(webhook_messages.c.type == "audit.violation")
        ).all()
    [payload] = [json.loads(row[0]) for row in rows]
    assert payload["data"]["counts"] == {"counter_ledger": 1}
    assert payload["data"]["listed"][0]["expected"] == "used 2"


def test_an_incremental_run_reads_from_its_watermark(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org-1", "burst", 2, event_id="first")
    clock.advance(minutes=2)  # past the settling lag: the next run starts after it
    first = run_audit(meter)
    assert first.full  # no run before
    clock.advance(hours=2)
    # A counter broken behind the audit's back, in a window no new event touches:
    c = counters.c
    corrupt(meter, update(counters).where(c.subject == "org-1").values(used=3))
    meter.consume("org-9", "burst", 1, event_id="second")
    later = run_audit(meter)
    assert later.violations == ()  # not touched since: left to a full run
    assert later.checked_from == first.checked_to
    assert found(run_audit(meter, full=True)) == {("counter_ledger", "org-1", "burst")}
    since = run_audit(meter, since=NOW - timedelta(minutes=1))
    assert found(since) == {("counter_ledger", "org-1", "burst")}


def test_a_window_touched_again_is_judged_from_what_was_kept(
    meter: Meter, clock: FrozenClock
) -> None:
    for i in range(3):
        meter.consume("org-1", "calls", 1, event_id=f"k{i}")
    clock.advance(minutes=5)
    run_audit(meter)
    clock.advance(minutes=5)
    meter.consume("org-1", "calls", 1, event_id="k3")
    meter.void("k0", "refund")
    clock.advance(minutes=5)
    assert run_audit(meter).violations == ()
    c = counters.c
    corrupt(meter, update(counters).where(c.limit_name == "calls").values(used=c.used + 1))
    meter.consume("org-1", "calls", 1, event_id="k4")
    assert found(run_audit(meter)) == {("counter_ledger", "org-1", "calls")}


def test_a_full_run_leaves_alone_the_windows_retention_pruned(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("org-1", "burst", 2, event_id="old")
    clock.advance(days=10)
    meter.consume("org-1", "burst", 1, event_id="young")
    pruned = prune(meter, RetentionPolicy(results_days=5), visibility_timeout_seconds=60)
    assert {p.table: p.rows for p in pruned}["results"] == 1
    clock.advance(minutes=2)
    report = run_audit(meter, full=True)
    assert report.violations == ()
    assert report.windows == 1  # the young window; the old one lost its ledger


def test_the_last_run_is_a_gauge_per_invariant(db_url: str, meter: Meter) -> None:
    def gauges() -> dict[str, float]:
        collector = lag_collector(db_url, "redis://127.0.0.1:1/0")
        text = generate_latest(exposition_registry([collector])).decode()
        return {
            s.labels["invariant"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "metering_invariant_violations"
        }

    assert gauges() == dict.fromkeys(INVARIANTS, 0)  # no run yet
    meter.consume("org-1", "burst", 2, event_id="one")
    c = counters.c
    corrupt(meter, update(counters).where(c.subject == "org-1").values(used=9))
    run_audit(meter)
    assert gauges() == dict.fromkeys(INVARIANTS, 0) | {"counter_ledger": 1, "hard_maximum": 1}


def test_beat_runs_the_audit_every_interval(
    db_url: str, meter: Meter, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = Settings(
        database_url=db_url, broker_url="redis://127.0.0.1:1/0", audit_interval_seconds=900
    )
    entry = create_app(own.broker_url, own).conf.beat_schedule["audit"]
    assert (entry["task"], entry["schedule"]) == (AUDIT_TASK, 900)
    assert tasks.app.tasks[AUDIT_TASK].name == AUDIT_TASK
    monkeypatch.setattr(tasks, "_meter", meter)
    monkeypatch.setattr(tasks, "settings", lambda: own)
    meter.consume("org-1", "burst", 2, event_id="one")
    assert tasks.audit_task() == dict.fromkeys(INVARIANTS, 0)  # the broker away: no queue check
    corrupt(meter, update(counters).values(used=1))
    assert tasks.audit_task()["counter_ledger"] == 1


def test_a_queued_event_older_than_the_bound_without_result_is_named(
    pg_url: str, redis_url: str
) -> None:
    with UsageProducer(redis_url, batch_size=2, flush_interval_seconds=60) as producer:
        for n in range(3):
            producer.emit(f"org-{n}", "burst", event_id=f"queued-{n}")
    clock = FrozenClock(datetime.now(UTC) + timedelta(minutes=20))
    options = AuditOptions(broker_url=redis_url, queue_seconds=900)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limit(Limit("burst", maximum=5, period="1h"))
        [violation] = run_audit(meter, options=options).violations
        assert (violation.invariant, violation.item) == (
            Invariant.QUEUE_UNDECIDED,
            "queued-0,queued-1",
        )
        assert violation.expected == "decided within 900s"
        for payload in queued_batches(redis_url):
            apply_batch(meter, payload)  # as a worker does
        assert run_audit(meter, options=options).violations == ()
        away = run_audit(meter, options=AuditOptions(broker_url="redis://127.0.0.1:1/0"))
        assert away.violations == () and away.notes[0].startswith("queues not checked: ")


def queued_batches(redis_url: str) -> list[object]:
    """The batches waiting on the default queue, as a worker decodes them."""
    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.lrange(DEFAULT_QUEUE, 0, -1)
    finally:
        client.close()
    found = []
    for raw in entries:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        found.append(json.loads(body)[0][0])
    return found


def test_settling_after_a_run_is_read_by_the_next(meter: Meter, clock: FrozenClock) -> None:
    meter.reserve("org-1", "burst", 2, event_id="more", ttl_seconds=3600)
    meter.reserve("org-2", "calls", 4, event_id="back", ttl_seconds=3600)
    meter.reserve("org-3", "burst", 1, event_id="voided", ttl_seconds=3600)
    clock.advance(minutes=2)
    assert run_audit(meter).violations == ()  # kept: the reserved costs
    clock.advance(minutes=2)
    meter.commit_reservation("more", actual=7)  # 2 past the maximum: overdraft
    meter.cancel_reservation("back")
    meter.void("voided", "never happened")
    clock.advance(minutes=2)
    report = run_audit(meter)
    assert (report.full, report.violations) == (False, ())
    assert report.windows == 4  # org-1 burst, org-2 calls and spend, org-3 burst
    assert run_audit(meter, full=True).violations == ()


def test_a_soft_window_past_its_maximum_made_hard_is_no_violation(
    meter: Meter, clock: FrozenClock
) -> None:
    """A soft limit let the window hold 7 of 5; made hard, it denies, and the ledger is whole."""
    meter.set_limit(Limit("chat", maximum=5, period="1d", window="calendar", enforcement="soft"))
    meter.consume("org-1", "chat", 7, event_id="soft")
    meter.set_limit(Limit("chat", maximum=5, period="1d", window="calendar"))
    assert not meter.consume("org-1", "chat", 1, event_id="hard").allowed
    clock.advance(minutes=2)
    assert run_audit(meter, full=True).violations == ()
    corrupt(meter, update(counters).where(counters.c.subject == "org-1").values(used=8))
    assert found(run_audit(meter, full=True)) == {
        ("counter_ledger", "org-1", "chat"),
        ("hard_maximum", "org-1", "chat"),
    }


HELD = Limit("held", maximum=100, period="1mo", window="calendar")


@pytest.mark.parametrize("incremental", [False, True])
def test_a_commit_of_more_after_a_reset_counts_what_it_added(
    meter: Meter, clock: FrozenClock, incremental: bool
) -> None:
    """The reset cleared the reserved unit; the commit after it added 2 more, which count."""
    meter.set_limit(HELD)
    if incremental:
        run_audit(meter, full=True)
    held = meter.reserve("org-1", "held", 1, ttl_seconds=60)
    clock.advance(minutes=2)
    assert meter.sweep_reservations()["committed"] == 1  # by the sweep, at its 1 unit
    clock.advance(seconds=1)
    meter.reset(subject="org-1", limit="held")
    clock.advance(seconds=1)
    meter.commit_reservation(held.id, actual=3)
    assert [counter.used for counter in meter.counters("org-1", "held")] == [2]
    clock.advance(minutes=2)
    assert run_audit(meter, full=not incremental).violations == ()
    assert run_audit(meter, full=True).violations == ()


@pytest.mark.parametrize("incremental", [False, True])
def test_a_reset_after_a_commit_of_more_clears_what_it_added(
    meter: Meter, clock: FrozenClock, incremental: bool
) -> None:
    meter.set_limit(HELD)
    held = meter.reserve("org-1", "held", 1)
    clock.advance(minutes=2)
    if incremental:
        run_audit(meter, full=True)  # the result, at its 1 unit
    meter.commit_reservation(held.id, actual=3)
    clock.advance(seconds=1)
    meter.reset(subject="org-1", limit="held")
    assert meter.counters("org-1", "held") == []
    clock.advance(minutes=2)
    assert run_audit(meter, full=not incremental).violations == ()
    assert run_audit(meter, full=True).violations == ()


def test_a_gauges_windows_are_not_summed_once_its_limit_adds_up(
    meter: Meter, clock: FrozenClock
) -> None:
    # November's window held the peak of its reports (40, of 40 and 30); the
    # limit made a sum in December: that window still holds a level.
    gauge = Limit("disk", maximum=100, period="1mo", window="calendar", aggregation="max")
    meter.set_limit(gauge)
    meter.consume("org", "disk", 40)
    meter.consume("org", "disk", 30)
    clock.advance(days=25)  # December
    meter.set_limit(Limit("disk", maximum=100, period="1mo", window="calendar"))
    meter.consume("org", "disk", 5)
    assert [c.used for c in meter.counters("org", "disk")] == [40, 5]
    assert run_audit(meter, full=True).violations == ()


def test_the_windows_a_gauge_made_a_sum_counts_in_are_judged(
    meter: Meter, clock: FrozenClock
) -> None:
    # As above; then both windows edited by hand: December's, a sum since its
    # start, is named; November's, which holds a level, is not judged.
    meter.consume("org", "disk", 40)
    clock.advance(days=25)  # December
    meter.set_limit(Limit("disk", maximum=100, period="1mo", window="calendar"))
    meter.consume("org", "disk", 5)
    c = counters.c
    corrupt(meter, update(counters).where(c.limit_name == "disk").values(used=c.used + 1))
    clock.advance(minutes=2)
    [violation] = run_audit(meter, full=True).violations
    assert (violation.invariant, violation.limit) == (Invariant.COUNTER_LEDGER, "disk")
    assert (violation.expected, violation.found) == ("used 5", "used 6")
