"""The audit's SQL (`metering/storage/audit.py`) on both databases: its marks;
the ledger since an instant (results, resets, voids, give-backs), each after
the instant only; the windows' sums kept between runs, replaced or merged;
counters, draws and overdrafts by window; the seats held by window, and the
metadata of unvoided results; orphans and what is left held past its
expiry; the last runs kept."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, func, select

from metering import FrozenClock, Limit, Meter
from metering.domain.audit import Invariant, Violation, WindowLedger
from metering.domain.instants import to_us
from metering.domain.reservations import HeldCharge
from metering.storage.audit import KEY_CHUNK, RUNS_KEPT, AuditStore
from metering.storage.reservations import ReservationStore
from metering.storage.tables import audit_runs

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
HOUR_US = to_us(NOW)  # the calendar hour's start: NOW is on the hour
LATER = NOW + timedelta(minutes=10)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h", window="calendar"))
        yield meter


def _run(meter: Meter, work: Callable[[AuditStore], Any]) -> Any:
    def in_transaction(connection: Connection) -> Any:
        return work(AuditStore(connection))

    return meter.database.run(in_transaction)


def test_a_mark_is_set_and_moved(meter: Meter) -> None:
    assert _run(meter, lambda store: store.mark("checked_to")) is None
    _run(meter, lambda store: store.set_mark("checked_to", 10))
    _run(meter, lambda store: store.set_mark("checked_to", 20))
    assert _run(meter, lambda store: store.mark("checked_to")) == 20


def test_the_ledger_since_an_instant_leaves_out_what_came_before(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("org", "calls", 2, event_id="early")
    meter.reserve("org", "calls", 1, event_id="held-early").cancel()
    clock.set(LATER)
    meter.consume("org", "calls", 1, event_id="late")
    meter.reserve("org", "calls", 2, event_id="held-late").cancel()
    meter.void("early", "refund")
    meter.reset("org", "calls")
    after = to_us(NOW)  # everything at NOW is before it; at LATER, after
    window = ("org", "calls", HOUR_US)

    every = _run(meter, lambda store: list(store.results_since(None)))
    since = _run(meter, lambda store: list(store.results_since(after)))
    assert sorted(row[0] for row in every) == ["early", "held-early", "held-late", "late"]
    assert sorted(row[0] for row in since) == ["held-late", "late"]
    late = next(row for row in since if row[0] == "late")
    assert late[1:3] == ("allowed", to_us(LATER))

    give_backs = _run(meter, lambda store: store.give_backs_since(None))
    assert sorted(give_backs) == [(window, 1, to_us(NOW)), (window, 2, to_us(LATER))]
    assert _run(meter, lambda store: store.give_backs_since(after)) == [(window, 2, to_us(LATER))]
    assert _run(meter, lambda store: store.voids_since(after)) == [(window, 2, to_us(LATER))]
    [(key, tick, at_us)] = _run(meter, lambda store: store.resets_since(after))
    assert (key, at_us) == (window, to_us(LATER)) and tick >= 1
    assert _run(meter, lambda store: store.resets_since(to_us(LATER))) == []


def test_windows_sums_are_kept_replaced_or_merged_in_chunks(meter: Meter) -> None:
    many = {("org", "calls", n): WindowLedger(n, 5) for n in range(KEY_CHUNK + 10)}
    _run(meter, lambda store: store.save_ledgers(many, replace=True))
    assert _run(meter, lambda store: store.ledgers(None)) == many
    changed = {("org", "calls", 1): WindowLedger(9, 6), ("new", "calls", 0): WindowLedger(1, 1)}
    _run(meter, lambda store: store.save_ledgers(changed, replace=False))
    keys = [("org", "calls", 1), ("org", "calls", 2), ("new", "calls", 0), ("none", "calls", 0)]
    assert _run(meter, lambda store: store.ledgers(keys)) == {
        ("org", "calls", 1): WindowLedger(9, 6),
        ("org", "calls", 2): WindowLedger(2, 5),
        ("new", "calls", 0): WindowLedger(1, 1),
    }
    _run(meter, lambda store: store.save_ledgers(changed, replace=True))
    assert _run(meter, lambda store: store.ledgers(None)) == changed


def test_counters_draws_and_overdrafts_are_read_by_window(meter: Meter) -> None:
    meter.grant("org", "calls", 10, grant_id="g-1")
    meter.consume("org", "calls", 7)  # 2 drawn on the grant
    meter.consume("other", "calls", 1)
    meter.database.run(
        lambda connection: ReservationStore(connection).add_overdrafts(
            "e-1", [("org", "calls", HOUR_US, 3)], to_us(NOW)
        )
    )
    window, other = ("org", "calls", HOUR_US), ("other", "calls", HOUR_US)
    assert _run(meter, lambda store: store.counters_of(None)) == {window: 7, other: 1}
    assert _run(meter, lambda store: store.counters_of([other])) == {other: 1}
    assert _run(meter, lambda store: store.drawn([window, other])) == {window: 2}
    assert _run(meter, lambda store: store.overdrawn([window])) == {window: 3}
    assert _run(meter, lambda store: store.grant_balances(None)) == [
        ("g-1", "org", "calls", 10, 2, 2)
    ]
    assert _run(meter, lambda store: store.grant_balances([("other", "calls")])) == []


def test_seats_held_are_read_by_window_and_by_value(meter: Meter) -> None:
    meter.set_limit(Limit("seats", maximum=5, period="1h", window="calendar", distinct="user"))
    for n, user in enumerate(["ann", "bob", "ann", "cy"]):
        meter.consume("org", "seats", metadata={"user": user}, event_id=f"s{n}")
    meter.consume("other", "seats", metadata={"user": 7}, event_id="s4")
    meter.void("s3", "left")  # cy's only event: her row stays, at 0
    window, other = ("org", "seats", HOUR_US), ("other", "seats", HOUR_US)
    assert _run(meter, lambda store: store.seats_held([window, other])) == {
        window: {"ann", "bob"},
        other: {"7"},
    }
    assert _run(meter, lambda store: store.seats_held([other])) == {other: {"7"}}
    found = _run(meter, lambda store: store.unvoided_metadata(["s0", "s3", "s4", "none"]))
    assert {k: json.loads(v) for k, v in found.items()} == {
        "s0": {"user": "ann"},
        "s4": {"user": 7},
    }


def test_orphans_and_what_is_held_past_its_expiry_are_violations(meter: Meter) -> None:
    meter.reserve("org", "calls", 1, event_id="held", ttl_seconds=60)
    charge = HeldCharge("org", "calls", 1, HOUR_US, HOUR_US + 3_600_000_000)
    meter.database.run(
        lambda connection: ReservationStore(connection).insert(
            "lost", [charge], to_us(NOW), to_us(NOW) + 1
        )
    )
    orphans = _run(meter, lambda store: store.orphans_since(None))
    assert [(v.invariant, v.item) for v in orphans] == [(Invariant.ONE_RESULT, "lost")]
    assert _run(meter, lambda store: store.orphans_since(to_us(NOW))) == []
    expired = to_us(NOW + timedelta(seconds=61))
    unresolved = _run(meter, lambda store: store.unresolved(expired))
    found = sorted((v.invariant, v.item) for v in unresolved)
    assert found == [
        (Invariant.RESERVATION_UNRESOLVED, "held"),
        (Invariant.RESERVATION_UNRESOLVED, "lost"),
    ]
    assert _run(meter, lambda store: store.unresolved(to_us(NOW))) == []
    assert _run(meter, lambda store: store.stuck_deliveries(expired)) == []


def test_the_latest_runs_are_kept(meter: Meter) -> None:
    assert _run(meter, lambda store: store.last_run()) is None
    broken = Violation(Invariant.ONE_RESULT, item="e-1", expected="a result", found="none")
    for n in range(RUNS_KEPT + 3):
        _run(
            meter,
            lambda store, n=n: store.record_run(
                n, (None, n), full=n == 0, windows=n, violations=[broken]
            ),
        )
    last = _run(meter, lambda store: store.last_run())
    assert last is not None
    assert (last["ran_at_us"], last["checked_from_us"], last["checked_to_us"]) == (
        RUNS_KEPT + 2,
        None,
        RUNS_KEPT + 2,
    )
    assert last["violations"] == [broken.to_dict()]
    with meter.sql_engine.connect() as connection:
        kept = connection.execute(select(func.count()).select_from(audit_runs)).scalar_one()
    assert kept == RUNS_KEPT
