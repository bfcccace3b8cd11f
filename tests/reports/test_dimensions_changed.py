"""A limit's dimension history on both databases: a void, a cancel and a commit of less (or
more) of an event decided before its limit's dimensions changed take back from (or add to)
the rows it was rolled up under, and the audit judges every row by it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from lock_waits import wait_until_waiting

from metering import FrozenClock, Limit, Meter
from metering.domain.rollups import RollupKey
from metering.errors import InvalidInput
from metering.reports import usage_by_dimension_report
from metering.storage.audit import AuditStore
from metering.storage.limits import LimitStore
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
META = {"route": "/a", "model": "m1"}


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        yield m


def calls(*dimensions: str) -> Limit:
    return Limit("calls", maximum=100, period="1d", window="calendar", dimensions=dimensions)


def rows(meter: Meter) -> dict[RollupKey, list[int]]:
    """Every rollup row's [used, events] by (dimension, value), the deltas summed in."""
    found = meter.database.read(lambda c: AuditStore(c).rollups(None))
    return {(key[2], key[4]): figures for key, figures in found.items() if any(figures)}


def before_and_after(meter: Meter, clock: FrozenClock, was: Limit, now: Limit) -> None:
    """Events decided under ``was``, given back (or charged more) under ``now``."""
    meter.set_limit(was)
    clock.advance(seconds=1)
    meter.consume("org", "calls", 3, event_id="voided", metadata=META)
    meter.consume("org", "calls", 2, event_id="kept", metadata=META)
    cancelled = meter.reserve("org", "calls", 4, event_id="cancelled", metadata=META)
    less = meter.reserve("org", "calls", 5, event_id="less", metadata=META)
    more = meter.reserve("org", "calls", 1, event_id="more", metadata=META)
    clock.advance(seconds=1)
    meter.set_limit(now)
    clock.advance(seconds=1)
    meter.void("voided", "refund")
    cancelled.cancel()
    less.commit(actual=2)
    more.commit(actual=3)
    meter.consume("org", "calls", 1, event_id="after", metadata=META)
    clock.advance(minutes=2)


def test_a_dimension_added_since_the_decision_gets_nothing_taken(
    meter: Meter, clock: FrozenClock
) -> None:
    before_and_after(meter, clock, calls("route"), calls("route", "model"))
    assert rows(meter) == {
        ("route", "/a"): [2 + 2 + 3 + 1, 4],  # kept, less, more, after
        ("model", "m1"): [1, 1],  # after alone
    }
    assert run_audit(meter, full=True).violations == ()


def test_a_dimension_removed_since_the_decision_gets_its_units_back(
    meter: Meter, clock: FrozenClock
) -> None:
    before_and_after(meter, clock, calls("route", "model"), calls("route"))
    assert rows(meter) == {
        ("route", "/a"): [2 + 2 + 3 + 1, 4],
        ("model", "m1"): [2 + 2 + 3, 3],  # after has none
    }
    assert run_audit(meter, full=True).violations == ()


def test_a_limit_deleted_and_defined_again_keeps_its_history(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(calls("route"))
    clock.advance(seconds=1)
    meter.consume("org", "calls", 3, event_id="voided", metadata=META)
    meter.delete_limit("calls")
    meter.set_limit(calls("model"))
    clock.advance(seconds=1)
    meter.void("voided", "refund")
    clock.advance(minutes=2)
    assert rows(meter) == {}
    assert run_audit(meter, full=True).violations == ()


def test_the_report_groups_by_a_key_its_limit_recorded_before(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(calls("route", "model"))
    meter.set_limit(Limit("gone", maximum=9, period="1h", dimensions=("tier",)))
    clock.advance(seconds=1)
    meter.consume("org", "calls", 3, event_id="a", metadata=META)
    meter.consume("org", "gone", 2, event_id="b", metadata={"tier": "gold"})
    meter.set_limit(calls("route"))  # "model" dropped, its rows kept
    meter.delete_limit("gone")
    clock.advance(minutes=2)

    def used(key: str, limit: str | None = None) -> list[tuple[str, str, int]]:
        report = usage_by_dimension_report(meter, subject="org", key=key, limit=limit)
        return [(row.limit, row.value, row.used) for row in report]

    assert used("model") == used("model", "calls") == [("calls", "m1", 3)]
    assert used("tier") == used("tier", "gone") == [("gone", "gold", 2)]
    with pytest.raises(
        InvalidInput, match="limit gone does not record dimension 'route'; it recorded tier"
    ):
        used("route", "gone")
    with pytest.raises(InvalidInput, match="the recorded ones are model, route, tier"):
        used("zone")


def _wait_for_locks(meter: Meter, count: int, thread: threading.Thread) -> None:
    """Until ``count`` sessions wait on a lock, or ``thread`` ended."""
    with meter.sql_engine.connect() as watch:
        wait_until_waiting(watch, count, "the sessions", thread)


def test_an_event_decided_with_the_old_dimensions_while_they_change_keeps_them(
    pg_url: str, clock: FrozenClock
) -> None:
    """The decision reads the limits' version, then waits on its counter's
    lock (held by another transaction); the change of dimensions, started
    meanwhile, waits for it to end: the event was rolled up under the old
    dimensions, and its void takes from those."""
    with Meter(pg_url, clock=clock, group_commit=False) as meter:
        meter.set_limit(calls("route"))
        meter.consume("org", "calls", 1, event_id="first", metadata=META)  # makes the counter
        raw = meter.sql_engine.raw_connection()
        try:
            raw.cursor().execute("SELECT used FROM counters WHERE limit_name = 'calls' FOR UPDATE")
            work: list[threading.Thread] = []
            found: list[Any] = []
            for job in (
                lambda: found.append(meter.consume("org", "calls", 3, event_id="e", metadata=META)),
                lambda: meter.set_limit(calls("route", "model")),
            ):
                work.append(threading.Thread(target=job))
                work[-1].start()
                _wait_for_locks(meter, len(work), work[-1])
            raw.commit()
            for thread in work:
                thread.join()
        finally:
            raw.close()
        assert found[0].allowed
        assert rows(meter) == {("route", "/a"): [4, 2]}  # e decided without "model"
        meter.void("e", "refund")
        clock.advance(minutes=2)
        assert rows(meter) == {("route", "/a"): [1, 1]}
        assert run_audit(meter, full=True).violations == ()


def test_two_changes_of_one_limit_at_once_leave_its_history_as_its_definition(
    pg_url: str, clock: FrozenClock
) -> None:
    """A change of dimensions is open; another definition of the limit, with
    the dimensions its history says last, starts meanwhile and commits after
    it: the history's last era is the definition the limit is left with, so
    the audit judges its rollups by what the decisions wrote."""
    with Meter(pg_url, clock=clock, group_commit=False) as meter:
        meter.set_limit(calls("route"))
        meter.consume("org", "calls", 1, event_id="first", metadata=META)
        with meter.sql_engine.connect() as open_change:
            store = LimitStore(open_change)
            store.record_dimensions([calls("route", "model")], meter.database.now_us())
            store.upsert_limit(calls("route", "model"), meter.database.now_us())
            back = threading.Thread(target=lambda: meter.set_limit(calls("route")))
            back.start()
            _wait_for_locks(meter, 1, back)
            open_change.commit()
        back.join()
        history = meter.database.read(lambda c: LimitStore(c).dimension_history())
        assert meter.get_limit("calls").dimensions == ("route",)
        assert history["calls"][-1].dimensions == ("route",)
        meter.consume("org", "calls", 2, event_id="second", metadata=META)
        clock.advance(minutes=2)
        assert run_audit(meter, full=True).violations == ()


def test_a_change_of_dimensions_held_up_by_a_long_transaction_holds_no_decision_up(
    pg_url: str, clock: FrozenClock
) -> None:
    """A transaction that read the limits' version stays open: the change
    of dimensions waiting for it yields (a lock timeout, then again), so a
    decision queued behind its lock goes on."""
    with Meter(pg_url, clock=clock, group_commit=False) as meter:
        meter.set_limit(calls("route"))
        meter.consume("org", "calls", 1, event_id="first", metadata=META)
        raw = meter.sql_engine.raw_connection()
        try:
            raw.cursor().execute("SELECT version FROM limits_version")  # held open
            changed: list[Any] = []
            change = threading.Thread(
                target=lambda: changed.append(meter.set_limit(calls("route", "model")))
            )
            change.start()
            _wait_for_locks(meter, 1, change)
            found: list[Any] = []
            decide = threading.Thread(
                target=lambda: found.append(meter.consume("org", "calls", 2, metadata=META))
            )
            decide.start()
            decide.join(timeout=30)
            assert not decide.is_alive(), "the decision waited for the long transaction"
            assert found[0].allowed
        finally:
            raw.commit()
            raw.close()
        change.join()
        assert changed, "the change of dimensions never went through"


def test_a_cancel_after_every_dimension_was_removed_still_takes_its_rows(
    meter: Meter, clock: FrozenClock
) -> None:
    """The direct settle has no rollups to take back: it declines a limit
    that had dimensions, now or when the event was decided."""
    meter.set_limit(calls("route"))
    clock.advance(seconds=1)
    cancelled = meter.reserve("org", "calls", 4, event_id="cancelled", metadata=META)
    less = meter.reserve("org", "calls", 5, event_id="less", metadata=META)
    meter.set_limit(calls())
    cancelled.cancel()
    less.commit(actual=2)
    clock.advance(minutes=2)
    assert rows(meter) == {("route", "/a"): [2, 1]}
    assert run_audit(meter, full=True).violations == ()
