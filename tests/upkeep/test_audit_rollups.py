"""`rollup_ledger` on both databases: the rollups the usage and spend reports bill from
equal the ledger after real traffic (dimensions, prices with and without a spend limit,
voids, cancels, commits of less and of more, resets, late events, a shadow charge, a
denial, a batch); a row edited by hand, and the rows three spend-report bugs left, are
named."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, update

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.domain.audit import Invariant, Violation
from metering.domain.instants import to_us
from metering.domain.rollups import hour_start_us
from metering.storage.rollups import compact_rollups
from metering.storage.tables import usage_rollup_deltas, usage_rollups
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
HOUR = hour_start_us(to_us(NOW))
A, B = {"route": "/a", "model": "m1"}, {"route": "/b", "model": "m2"}


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(
            Limit("calls", maximum=100, period="1d", window="calendar", dimensions=["route"])
        )
        m.set_limit(
            Limit(
                "tokens",
                maximum=1_000,
                period="1d",
                window="calendar",
                dimensions=["route", "model"],
            )
        )
        m.set_limit(Limit("plain", maximum=5, period="1h", window="calendar", dimensions=["route"]))
        m.set_limit(
            Limit("trial", maximum=1, period="1d", enforcement="shadow", dimensions=["route"])
        )
        m.set_limit(spend_limit("usd_cap", "50", "USD", "1mo", window="calendar"))
        m.set_price("calls", "0.01", "EUR")  # no spend limit in EUR
        m.set_price("tokens", "0.02", "USD")  # capped by usd_cap
        clock.advance(seconds=1)
        yield m


def traffic(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org-1", "calls", 3, event_id="c1", metadata=A)
    meter.consume("org-1", "calls", 2, event_id="c2", metadata=B)
    meter.consume(
        charges=[("org-1", "tokens", 4), ("org-1", "plain", 1)], event_id="t1", metadata=A
    )
    meter.consume("org-1", "tokens", 3, event_id="t2", metadata=B)
    meter.consume("org-1", "trial", 2, event_id="shadow", metadata=A)  # would deny: nothing
    meter.consume("org-1", "plain", 9, event_id="denied", metadata=A)
    meter.void("c1", "refund")
    meter.void("t1", "refund")
    meter.reserve("org-2", "calls", 4, event_id="r-cancel", metadata=A).cancel()
    meter.reserve("org-2", "tokens", 5, event_id="r-cancel-usd", metadata=A).cancel()
    meter.reserve("org-2", "calls", 5, event_id="r-less", metadata=B).commit(actual=2)
    meter.reserve("org-2", "tokens", 5, event_id="r-less-usd", metadata=B).commit(actual=1)
    meter.reserve("org-2", "plain", 2, event_id="r-more", metadata=A).commit(actual=4)
    meter.reserve("org-2", "calls", 1, event_id="r-none", metadata=B).commit(actual=0)
    meter.reserve("org-2", "calls", 3, event_id="r-held", metadata=A, ttl_seconds=86_400)
    voided = meter.reserve("org-2", "tokens", 2, event_id="r-void", metadata=A)
    voided.commit(actual=1)
    meter.void("r-void", "refund")
    meter.consume("org-3", "plain", 2, event_id="before-reset", metadata=A)
    reset = meter.reserve("org-3", "calls", 2, event_id="r-reset", metadata=A)
    clock.advance(seconds=1)
    meter.reset("org-3", "plain")
    meter.reset("org-3", "calls")  # the held units go with the rest; the cancel releases them
    clock.advance(seconds=1)
    reset.cancel()
    meter.consume("org-3", "plain", 1, event_id="after-reset", metadata=B)
    clock.advance(hours=2)
    late = clock() - timedelta(hours=2)
    meter.consume("org-1", "calls", 7, event_id="late", metadata=A, occurred_at=late)
    meter.consume("org-1", "calls", 1, event_id="now", metadata={"route": ["x", 1]})
    batch = [  # a worker's batch (and an import's)
        make_event([("org-4", "calls", 2)], late, "b1", A),
        make_event([("org-4", "tokens", 3), ("org-4", "plain", 1)], clock(), "b2", B),
    ]
    meter.apply(batch)
    meter.void("b2", "refund")
    clock.advance(minutes=2)


def rollups_of(violations: tuple[Violation, ...]) -> list[tuple[str | None, ...]]:
    return [
        (v.subject, v.limit, str(v.window_start_us), v.expected, v.found)
        for v in violations
        if v.invariant == Invariant.ROLLUP_LEDGER
    ]


def edit(meter: Meter, subject: str, limit: str, dimension: str, value: str, used: int) -> None:
    """Add ``used`` (and no event) to one rollup row, its deltas folded in first."""
    with meter.sql_engine.begin() as connection:
        compact_rollups(connection)
        r = usage_rollups.c
        connection.execute(
            update(usage_rollups)
            .where(r.subject == subject, r.limit_name == limit, r.dimension == dimension)
            .where(r.hour_start_us == HOUR, r.value == value)
            .values(used=r.used + used)
        )


def add_delta(
    meter: Meter,
    subject: str,
    limit: str,
    dimension: str,
    value: str,
    used: int,
    *,
    events: int = 0,
    hour: int = HOUR,
) -> None:
    """One rollup delta written by hand (a writer's bug, or an edit)."""
    row = {"subject": subject, "limit_name": limit, "dimension": dimension, "value": value}
    with meter.sql_engine.begin() as connection:
        connection.execute(
            insert(usage_rollup_deltas).values(**row, hour_start_us=hour, used=used, events=events)
        )


def left_by_a_bug(meter: Meter, subject: str, limit: str, currency: str, used: int) -> None:
    """A spend row as a bug left it: ``used`` minor units (and their event) never taken off."""
    add_delta(meter, subject, limit, "$spend", currency, used, events=1)


def test_a_clean_ledger_proves_its_rollups(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    report = run_audit(meter, full=True)
    assert report.violations == ()
    assert run_audit(meter, since=NOW).violations == ()
    with meter.sql_engine.begin() as connection:
        compact_rollups(connection)
    assert run_audit(meter, full=True).violations == ()


@pytest.mark.parametrize(
    ("subject", "limit", "dimension", "value", "expected"),
    [
        ("org-1", "calls", "route", "/a", "used 7, events 1"),  # c1 voided; the late event
        ("org-1", "calls", "$spend", "EUR", "used 9, events 2"),
        ("org-4", "calls", "route", "/a", "used 2, events 1"),  # a late event in a batch
        ("org-1", "tokens", "model", "m2", "used 3, events 1"),
        ("org-2", "calls", "route", "/b", "used 2, events 1"),  # a commit of less; none left
        ("org-2", "calls", "route", "/a", "used 3, events 1"),  # cancelled, and held
        ("org-2", "tokens", "$spend", "USD", "used 2, events 1"),  # a commit of less
        ("org-2", "plain", "route", "/a", "used 4, events 1"),  # a commit of more
        ("org-3", "calls", "route", "/a", "used 0, events 0"),  # reset, then cancelled
        ("org-3", "plain", "route", "/a", "used 2, events 1"),
    ],
)
def test_a_rollup_row_edited_by_hand_is_named(
    meter: Meter,
    clock: FrozenClock,
    subject: str,
    limit: str,
    dimension: str,
    value: str,
    expected: str,
) -> None:
    traffic(meter, clock)
    edit(meter, subject, limit, dimension, value, 1)
    used, events = (int(n.split()[-1]) for n in expected.split(", "))
    found = f"{dimension} {value!r}: used {used + 1}, events {events}"
    row = (subject, limit, str(HOUR), f"{dimension} {value!r}: {expected}", found)
    assert rollups_of(run_audit(meter, full=True).violations) == [row]
    assert rollups_of(run_audit(meter, since=NOW).violations) == [row]


def test_a_late_event_counts_in_the_hour_it_occurred(meter: Meter, clock: FrozenClock) -> None:
    traffic(meter, clock)
    with meter.sql_engine.begin() as connection:
        compact_rollups(connection)
        r = usage_rollups.c
        connection.execute(
            update(usage_rollups)
            .where(r.subject == "org-1", r.limit_name == "calls", r.value == "/a")
            .values(hour_start_us=HOUR + 2 * 3_600_000_000)  # counted when it came
        )
    found = rollups_of(run_audit(meter, full=True).violations)
    assert [(hour, expected) for _, _, hour, expected, _ in found] == [
        (str(HOUR), "route '/a': used 7, events 1"),
        (str(HOUR + 2 * 3_600_000_000), "route '/a': used 0, events 0"),
    ]


def test_a_void_that_leaves_its_money_is_named(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org-1", "calls", 3, event_id="c1", metadata=A)
    meter.consume("org-1", "calls", 2, event_id="c2", metadata=A)
    meter.void("c1", "refund")
    left_by_a_bug(meter, "org-1", "calls", "EUR", 3)  # no spend limit in EUR
    [(_, _, _, expected, found)] = rollups_of(run_audit(meter, full=True).violations)
    assert (expected, found) == ("$spend 'EUR': used 2, events 1", "$spend 'EUR': used 5, events 2")


def test_a_cancel_that_leaves_its_money_is_named(meter: Meter, clock: FrozenClock) -> None:
    meter.reserve("org-2", "calls", 4, event_id="r-1", metadata=A).cancel()
    left_by_a_bug(meter, "org-2", "calls", "EUR", 4)
    [(_, _, _, expected, found)] = rollups_of(run_audit(meter, full=True).violations)
    assert (expected, found) == ("$spend 'EUR': used 0, events 0", "$spend 'EUR': used 4, events 1")


def test_a_commit_of_less_that_keeps_all_its_money_is_named(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.reserve("org-2", "calls", 5, event_id="r-1", metadata=A).commit(actual=2)
    add_delta(meter, "org-2", "calls", "$spend", "EUR", 3)  # the spend row kept all 5 units' money
    [(_, _, _, expected, found)] = rollups_of(run_audit(meter, full=True).violations)
    assert (expected, found) == ("$spend 'EUR': used 2, events 1", "$spend 'EUR': used 5, events 1")


def test_a_since_run_judges_the_hours_touched_since(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org-1", "calls", 3, event_id="c1", metadata=A)
    meter.consume(
        "org-1", "calls", 2, event_id="old", metadata=B, occurred_at=NOW - timedelta(hours=3)
    )
    clock.advance(hours=1)
    since = clock()
    clock.advance(seconds=1)
    meter.void("c1", "refund")  # touches its hour again
    clock.advance(minutes=2)
    old = HOUR - 3 * 3_600_000_000
    add_delta(meter, "org-1", "calls", "route", "/b", 1, hour=old)
    assert rollups_of(run_audit(meter, since=since).violations) == []
    assert [hour for _, _, hour, _, _ in rollups_of(run_audit(meter, full=True).violations)] == [
        str(old)
    ]
    edit(meter, "org-1", "calls", "route", "/a", 1)
    assert [hour for _, _, hour, _, _ in rollups_of(run_audit(meter, since=since).violations)] == [
        str(HOUR)
    ]


def test_an_incremental_run_does_not_judge_rollups(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org-1", "calls", 3, event_id="c1", metadata=A)
    clock.advance(minutes=2)
    assert run_audit(meter).full
    edit(meter, "org-1", "calls", "route", "/a", 1)
    meter.consume("org-1", "calls", 1, event_id="c2", metadata=A)
    clock.advance(minutes=2)
    assert rollups_of(run_audit(meter).violations) == []
    assert len(rollups_of(run_audit(meter, full=True).violations)) == 1


def test_a_limit_defined_again_has_its_older_rows_judged_by_their_dimensions(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("org-1", "calls", 3, event_id="c1", metadata=A)
    clock.advance(seconds=1)
    meter.set_limit(
        Limit("calls", maximum=100, period="1d", window="calendar", dimensions=["model"])
    )
    clock.advance(hours=1)
    meter.consume("org-1", "calls", 2, event_id="c2", metadata=B)
    clock.advance(minutes=2)
    assert run_audit(meter, full=True).violations == ()  # c1 under "route", c2 under "model"
    edit(meter, "org-1", "calls", "route", "/a", 1)  # a key of it no more: judged all the same
    [(_, _, hour, expected, found)] = rollups_of(run_audit(meter, full=True).violations)
    assert (hour, expected, found) == (
        str(HOUR),
        "route '/a': used 3, events 1",
        "route '/a': used 4, events 1",
    )
    edit(meter, "org-1", "calls", "route", "/a", -1)
    with meter.sql_engine.begin() as connection:
        r = usage_rollups.c
        connection.execute(
            update(usage_rollups)
            .where(r.limit_name == "calls", r.dimension == "model")
            .values(events=r.events + 1)
        )
    [(_, _, hour, expected, found)] = rollups_of(run_audit(meter, full=True).violations)
    assert (hour, expected, found) == (
        str(HOUR + 3_600_000_000),
        "model 'm2': used 2, events 1",
        "model 'm2': used 2, events 2",
    )


def test_a_seat_hour_with_a_void_is_judged_by_its_events(meter: Meter) -> None:
    seats = Limit("seats", 5, period="1h", window="calendar", distinct="user", dimensions=["route"])
    meter.set_limit(seats)
    for event_id in ("s1", "s2"):
        meter.consume("org-5", "seats", event_id=event_id, metadata={**A, "user": "ann"})
    meter.void("s1", "refund")  # ann keeps her seat: s2 is live; one event left
    assert run_audit(meter, full=True).violations == ()
    edit(meter, "org-5", "seats", "route", "/a", 1)  # its used is not the ledger's to say
    assert run_audit(meter, full=True).violations == ()
    with meter.sql_engine.begin() as connection:
        r = usage_rollups.c
        connection.execute(
            update(usage_rollups).where(r.limit_name == "seats").values(events=r.events + 1)
        )
    assert rollups_of(run_audit(meter, full=True).violations) == [
        ("org-5", "seats", str(HOUR), "route '/a': events 1", "route '/a': used 2, events 2")
    ]
    add_delta(meter, "org-5", "seats", "$spend", "USD", 3)  # money follows no seat: judged whole
    assert rollups_of(run_audit(meter, full=True).violations)[0] == (
        "org-5",
        "seats",
        str(HOUR),
        "$spend 'USD': used 0, events 0",
        "$spend 'USD': used 3, events 0",
    )


@pytest.mark.parametrize("change", ["deleted", "made plain"])
def test_a_seat_hour_with_a_void_stays_unknown_when_its_limit_is_no_seat_limit_now(
    meter: Meter, change: str
) -> None:
    seats = Limit("seats", 5, period="1h", window="calendar", distinct="user", dimensions=["route"])
    meter.set_limit(seats)
    for event_id in ("s1", "s2"):
        meter.consume("org-5", "seats", event_id=event_id, metadata={**A, "user": "ann"})
    meter.void("s1", "refund")  # ann keeps her seat: s2 (cost 0) is live, used stays 1
    if change == "deleted":
        meter.delete_limit("seats")
    else:
        meter.set_limit(Limit("seats", 5, period="1h", window="calendar", dimensions=["route"]))
    assert run_audit(meter, full=True).violations == ()
