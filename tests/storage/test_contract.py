"""The storage contract: every test runs on SQLite and on PostgreSQL alike."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from servers import copy_sqlite
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.errors import EventConflict, InvalidInput, OccurredAtOutOfRange, UnknownLimit
from metering.storage.tables import counters, results

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("send_message", maximum=5, period="2m"))
        m.set_limit(Limit("api", maximum=10, period="10s", algorithm="token_bucket"))
        m.set_limit(Limit("user_calls", maximum=100, period="1h", window="calendar"))
        m.set_limit(Limit("org_calls", maximum=3, period="1h", window="calendar"))
        m.set_limit(Limit("seats", maximum=10, period="1mo", window="calendar", enforcement="soft"))
        yield m


def snapshot(meter: Meter) -> tuple[object, ...]:
    """Everything stored, to show that bad input changes nothing."""
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(select(counters).order_by(*counters.primary_key)).all()
        ledger = connection.execute(select(results).order_by(results.c.event_id)).all()
    return (tuple(rows), tuple(ledger), tuple(meter.list_limits()))


def test_limits_round_trip_and_delete(meter: Meter) -> None:
    limit = Limit("exports", maximum=3, period="1d", window="calendar", thresholds=(100, 80))
    meter.set_limit(limit)
    assert meter.get_limit("exports") == limit
    assert meter.get_limit("exports").thresholds == (80, 100)
    assert "exports" in [lim.name for lim in meter.list_limits()]
    meter.delete_limit("exports")
    with pytest.raises(UnknownLimit):
        meter.get_limit("exports")
    with pytest.raises(UnknownLimit):
        meter.delete_limit("exports")


def test_inclusive_maximum_and_reset_at_resets_at(meter: Meter, clock: FrozenClock) -> None:
    decisions = [meter.consume("visitor-1", "send_message") for _ in range(6)]
    assert [d.outcome for d in decisions] == ["allowed"] * 5 + ["denied"]
    denied = decisions[-1]
    assert (denied.used, denied.remaining) == (5, 0)
    assert denied.resets_at == START + timedelta(minutes=2)
    assert denied.retry_at == denied.resets_at
    clock.set(denied.resets_at - timedelta(microseconds=1))
    assert not meter.consume("visitor-1", "send_message").allowed
    clock.set(denied.resets_at)
    fresh = meter.consume("visitor-1", "send_message")
    assert fresh.allowed and fresh.used == 1
    assert fresh.resets_at == denied.resets_at + timedelta(minutes=2)
    [old, new] = meter.counters("visitor-1", "send_message")
    assert (old.used, old.denied_count, old.denied_cost) == (5, 2, 2)
    assert (new.used, new.denied_count) == (1, 0)


def test_changed_limit_applies_to_later_events(meter: Meter) -> None:
    for _ in range(5):
        meter.consume("v", "send_message")
    assert not meter.consume("v", "send_message").allowed
    meter.set_limit(Limit("send_message", maximum=7, period="2m"))
    assert meter.consume("v", "send_message").remaining == 1


def test_token_bucket_refills_exactly(meter: Meter, clock: FrozenClock) -> None:
    assert [meter.consume("u", "api").allowed for _ in range(11)].count(True) == 10
    clock.advance(seconds=4)
    assert [meter.consume("u", "api").allowed for _ in range(5)] == [True] * 4 + [False]


def test_calendar_month_window_by_event_time(meter: Meter, clock: FrozenClock) -> None:
    clock.set(datetime(2026, 11, 30, 23, 59, tzinfo=UTC))
    late_november = meter.consume("org-1", "seats", cost=4)
    early_december = meter.consume("org-1", "seats", cost=4, occurred_at=clock.now)
    clock.set(datetime(2026, 12, 1, 0, 1, tzinfo=UTC))
    december = meter.consume("org-1", "seats", cost=4)
    assert late_november.resets_at == datetime(2026, 12, 1, tzinfo=UTC)
    assert early_december.used == 8
    assert december.used == 4
    assert december.resets_at == datetime(2027, 1, 1, tzinfo=UTC)


def test_soft_limit_records_overage(meter: Meter) -> None:
    first = meter.consume("org-1", "seats", cost=8)
    second = meter.consume("org-1", "seats", cost=5)
    assert first.outcome == "allowed"
    assert second.outcome == "overage" and second.allowed
    assert (second.used, second.charges[0].overage, second.remaining) == (13, 3, 0)


def test_same_event_id_changes_counters_once(meter: Meter) -> None:
    decisions = [meter.consume("v", "send_message", event_id="evt-1") for _ in range(5)]
    assert [d.duplicate for d in decisions] == [False, True, True, True, True]
    assert {d.used for d in decisions} == {1}
    assert all(d.charges == decisions[0].charges for d in decisions)
    [counter] = meter.counters("v", "send_message")
    assert counter.used == 1
    stored = meter.result("evt-1")
    assert stored is not None and stored.outcome == "allowed" and not stored.duplicate


def test_same_event_id_with_other_charges_is_a_conflict(meter: Meter) -> None:
    meter.consume("v", "send_message", event_id="evt-2")
    before = snapshot(meter)
    with pytest.raises(EventConflict):
        meter.consume("v", "send_message", cost=2, event_id="evt-2")
    with pytest.raises(EventConflict):
        meter.consume("w", "send_message", event_id="evt-2")
    assert snapshot(meter) == before


def test_stacked_denial_consumes_nothing_and_names_the_limit(meter: Meter) -> None:
    charges = [("user-7", "user_calls", 2), ("org-42", "org_calls", 2)]
    assert meter.consume(charges=charges).allowed
    denied = meter.consume(charges=charges, event_id="job-991")
    assert not denied.allowed and denied.outcome == "denied"
    assert denied.denied_by == ("org_calls",)
    user, org = denied.charges
    assert user.allowed and user.used == 2
    assert not org.allowed and org.used == 2
    counts = {(c.subject, c.limit): (c.used, c.denied_count) for c in meter.counters()}
    assert counts[("user-7", "user_calls")] == (2, 0)
    assert counts[("org-42", "org_calls")] == (2, 1)
    stored = meter.result("job-991")
    assert stored is not None and stored.denied_by == ("org_calls",)


def test_check_consumes_nothing(meter: Meter) -> None:
    for _ in range(4):
        meter.consume("v", "send_message")
    before = snapshot(meter)
    checked = meter.check("v", "send_message", cost=1)
    assert checked.allowed and checked.remaining == 0 and checked.event_id is None
    assert not meter.check("v", "send_message", cost=2).allowed
    assert snapshot(meter) == before


def test_reset_clears_the_current_window_only(meter: Meter, clock: FrozenClock) -> None:
    for _ in range(5):
        meter.consume("v", "send_message")
    clock.advance(minutes=3)
    for _ in range(5):
        meter.consume("v", "send_message")
    assert meter.reset(subject="v", limit="send_message") == 1
    assert meter.consume("v", "send_message").used == 1
    assert [c.used for c in meter.counters("v", "send_message")] == [5, 1]
    with pytest.raises(InvalidInput):
        meter.reset()


def test_events_outside_the_allowed_time_range_are_rejected(meter: Meter) -> None:
    before = snapshot(meter)
    with pytest.raises(OccurredAtOutOfRange):
        meter.consume("v", "send_message", occurred_at=START - timedelta(days=1, seconds=1))
    with pytest.raises(OccurredAtOutOfRange):
        meter.consume("v", "send_message", occurred_at=START + timedelta(minutes=5, seconds=1))
    assert snapshot(meter) == before
    assert meter.consume("v", "send_message", occurred_at=START - timedelta(days=1)).allowed


def test_late_first_use_event_lands_in_the_window_it_falls_in(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("v", "send_message")  # window [12:00, 12:02)
    clock.advance(minutes=10)
    meter.consume("v", "send_message")  # window [12:10, 12:12)
    late = meter.consume("v", "send_message", occurred_at=START + timedelta(minutes=1))
    assert late.used == 2 and late.resets_at == START + timedelta(minutes=2)
    gap = meter.consume("v", "send_message", occurred_at=START + timedelta(minutes=5))
    assert gap.used == 1 and gap.resets_at == START + timedelta(minutes=7)
    # A window opened at 12:09 would overlap the next one: charged to that one.
    overlap = meter.consume("v", "send_message", occurred_at=START + timedelta(minutes=9))
    assert overlap.used == 2 and overlap.resets_at == START + timedelta(minutes=12)
    assert [c.used for c in meter.counters("v", "send_message")] == [2, 1, 2]


def test_bad_input_changes_nothing(meter: Meter) -> None:
    meter.consume("v", "send_message", event_id="kept")
    before = snapshot(meter)
    bad_calls = [
        lambda: meter.consume("", "send_message"),
        lambda: meter.consume("x" * 201, "send_message"),
        lambda: meter.consume("v", "no_such_limit"),
        lambda: meter.consume("v", "send_message", cost=0),
        lambda: meter.consume("v", "send_message", cost=-1),
        lambda: meter.consume("v", "send_message", cost=1.5),  # type: ignore[arg-type]
        lambda: meter.consume("v", "send_message", cost=10**15),
        lambda: meter.consume("v", "send_message", event_id="has space"),
        lambda: meter.consume("v", "send_message", occurred_at=datetime(2026, 11, 22)),
        lambda: meter.consume(charges=[("v", "send_message", 1), ("w", "missing", 1)]),
        lambda: meter.set_limit(Limit("x", maximum=0, period="1m")),
        lambda: meter.check("v", "no_such_limit"),
    ]
    for call in bad_calls:
        with pytest.raises((InvalidInput, UnknownLimit)):
            call()
    assert snapshot(meter) == before


def test_batch_rejects_invalid_events_and_keeps_going(meter: Meter) -> None:
    events = [
        make_event([("v", "send_message", 1)], START, "b-1"),
        make_event([("v", "unknown_limit", 1)], START, "b-2"),
        make_event([("v", "send_message", 1)], START - timedelta(days=2), "b-3"),
        make_event([("v", "send_message", 1)], START, "b-4"),
        make_event([("v", "send_message", 1)], START, "b-1"),
        make_event([("v", "send_message", 9)], START, "b-4"),
    ]
    applied = meter.apply(events)
    outcomes = [a.outcome if not isinstance(a, EventConflict) else "conflict" for a in applied]
    assert outcomes == ["allowed", "rejected", "rejected", "allowed", "allowed", "conflict"]
    assert "unknown limit" in (meter.result("b-2").reason or "")  # type: ignore[union-attr]
    assert [c.used for c in meter.counters("v")] == [2]
    with meter.sql_engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(results)).scalar() == 4


def test_a_batch_decides_like_events_one_by_one(
    db_url: str, sqlite_template: Path, tmp_path: Path
) -> None:
    """The same random stream, applied as one batch and event by event, agrees."""
    rng = random.Random(7)
    limits = [
        Limit("fw", maximum=7, period="30s"),
        Limit("cal", maximum=9, period="1m", window="calendar"),
        Limit("tb", maximum=5, period="10s", algorithm="token_bucket"),
        Limit("soft", maximum=4, period="1m", window="calendar", enforcement="soft"),
    ]
    events = []
    at = START
    for n in range(300):
        at += timedelta(milliseconds=rng.randrange(0, 900))
        chosen = rng.sample(limits, rng.choice([1, 1, 2]))
        subject = f"s{rng.randrange(4)}"
        charges = [(subject, lim.name, rng.randrange(1, 4)) for lim in chosen]
        events.append(make_event(charges, at, f"e{n}"))
    clock = FrozenClock(at)
    batch_url = copy_sqlite(sqlite_template, tmp_path / "batch.db")
    with Meter(db_url, clock=clock) as one_by_one, Meter(batch_url, clock=clock) as batch:
        one_by_one.set_limits(limits)
        batch.set_limits(limits)
        sequential = [one_by_one.apply([event])[0] for event in events]
        together = batch.apply(events)
        assert [d.to_dict() for d in together] == [d.to_dict() for d in sequential]  # type: ignore[union-attr]
        assert batch.counters() == one_by_one.counters()
