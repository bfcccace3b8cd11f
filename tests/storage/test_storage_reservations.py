"""Reservation rows (`metering/storage/reservations.py`) on both databases:
inserted, read and settled by `ReservationStore` or by the hot path's fixed
statements alike; listed by state and by a subject named literally; the
sweep commits the expired held ones and deletes settled ones, but keeps a
cancelled one while its result stands; a reset's cleared counters leave
held charges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, insert, select

from metering import Meter
from metering.domain.reservations import HeldCharge, ReservationState
from metering.storage.reservations import (
    INSERT_HELD,
    SELECT_RESERVATION,
    SETTLE,
    ReservationStore,
    hold_row,
    record_of_row,
    settle_row,
)
from metering.storage.tables import overdrafts, results

HELD, COMMITTED, CANCELLED = (
    ReservationState.HELD,
    ReservationState.COMMITTED,
    ReservationState.CANCELLED,
)


def charge(subject: str, limit: str = "calls", cost: int = 2, start: int = 0) -> HeldCharge:
    return HeldCharge(subject, limit, cost, start, start + 3_600_000_000)


@pytest.fixture
def connection(db_url: str) -> Iterator[Connection]:
    with Meter(db_url) as meter, meter.sql_engine.begin() as connection:
        yield connection


def _placeholder(connection: Connection) -> str:
    return "%s" if connection.dialect.name == "postgresql" else "?"


def test_a_reservation_is_stored_read_and_settled(connection: Connection) -> None:
    store = ReservationStore(connection)
    charges = [charge("org"), charge("org", "tokens", 7)]
    store.insert("r-1", charges, 10, 20)
    held = store.get("r-1", lock=True)
    assert held is not None
    assert (held.state, held.charges, held.created_at_us, held.expires_at_us) == (
        HELD,
        tuple(charges),
        10,
        20,
    )
    assert (held.settled_at_us, held.settled_by, held.given_back) == (None, None, ())
    store.settle("r-1", CANCELLED, 15, "api", [("org", "calls", 0, 2), ("org", "tokens", 0, 7)])
    settled = store.get("r-1")
    assert settled is not None and settled.state == CANCELLED
    assert (settled.settled_at_us, settled.settled_by) == (15, "api")
    assert settled.given_back == (("org", "calls", 0, 2), ("org", "tokens", 0, 7))
    assert store.get("r-2") is None


def test_the_hot_paths_statements_write_what_the_store_writes(connection: Connection) -> None:
    mark = _placeholder(connection)
    store = ReservationStore(connection)
    charges = [charge("org")]
    store.insert("by-store", charges, 10, 20)
    connection.exec_driver_sql(INSERT_HELD.format(mark), hold_row("by-row", charges, 10, 20))
    given_back = [("org", "calls", 0, 1)]
    store.settle("by-store", COMMITTED, 15, "api", given_back)
    connection.exec_driver_sql(
        SETTLE.format(mark), settle_row("by-row", COMMITTED, 15, "api", given_back)
    )
    [row] = connection.exec_driver_sql(SELECT_RESERVATION.format(mark), ("by-row",)).all()
    by_row, by_store = record_of_row(row), store.get("by-store")
    assert by_store is not None and by_row.id == "by-row"
    assert by_row == type(by_row)(**{**_fields(by_store), "id": "by-row"})
    assert settle_row("x", CANCELLED, 1, "api")[3] is None  # nothing given back: no JSON


def _fields(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__slots__}


def test_a_subject_is_matched_literally_in_a_reservations_charges(
    connection: Connection,
) -> None:
    store = ReservationStore(connection)
    subjects = ["org_1", "orgX1", "50%", '"quoted"\\', "org_1-team"]
    for n, subject in enumerate(subjects):
        store.insert(f"r-{n}", [charge(subject)], n, 100)
    store.insert("both", [charge("orgX1"), charge("org_1", "tokens")], 9, 100)
    for subject in subjects:
        listed = [r.id for r in store.list(subject=subject)]
        expected = [f"r-{subjects.index(subject)}"]
        assert listed == (["both", *expected] if subject in ("org_1", "orgX1") else expected)
    assert store.list(subject="org") == []
    store.settle("r-0", COMMITTED, 50, "api")
    assert [r.id for r in store.list(state="committed")] == ["r-0"]
    assert [r.id for r in store.list(count=2)] == ["both", "r-4"]  # newest first
    assert store.count_by_state() == {"held": 5, "committed": 1}


def test_the_sweep_commits_the_expired_and_deletes_the_settled(connection: Connection) -> None:
    store = ReservationStore(connection)
    store.insert("expired", [charge("org")], 0, 100)
    store.insert("live", [charge("org")], 0, 200)
    store.insert("cancelled", [charge("org")], 0, 200)
    store.settle("cancelled", CANCELLED, 50, "api", [("org", "calls", 0, 2)])
    store.insert("committed", [charge("org")], 0, 200)
    store.settle("committed", COMMITTED, 50, "api")
    assert store.commit_expired(100) == 1
    expired = store.get("expired")
    assert expired is not None and (expired.state, expired.settled_by) == (COMMITTED, "sweeper")
    connection.execute(
        insert(results).values(
            event_id="cancelled",
            outcome="allowed",
            fingerprint='[["org","calls",2]]',
            occurred_at_us=0,
            decided_at_us=0,
            denied_by=None,
            reason=None,
            charges="[]",
            metadata=None,
        )
    )
    # the cancel's give-back stays while its result does (a void needs both)
    assert store.delete_settled_before(101) == 2
    assert sorted(r.id for r in store.list()) == ["cancelled", "live"]
    connection.execute(results.delete())
    assert store.delete_settled_before(101) == 1
    assert [r.id for r in store.list()] == ["live"]


def test_a_resets_cleared_counters_leave_held_charges(connection: Connection) -> None:
    store = ReservationStore(connection)
    store.insert("a", [charge("org"), charge("org", "tokens")], 0, 100)
    store.insert("b", [charge("org", start=3_600_000_000)], 1, 100)
    store.insert("c", [charge("other")], 2, 100)
    store.insert("done", [charge("org")], 3, 100)
    store.settle("done", COMMITTED, 5, "api")
    store.lock_held("org")
    assert store.forget_held_charges("org", {("org", "calls", 0)}) == 1
    held = {r.id: [(c.subject, c.limit) for c in r.charges] for r in store.list()}
    assert held == {
        "a": [("org", "tokens")],
        "b": [("org", "calls")],  # another window
        "c": [("other", "calls")],
        "done": [("org", "calls")],  # settled: left alone
    }
    assert store.forget_held_charges(None, {("other", "calls", 0)}) == 1


def test_a_commits_overdraft_is_recorded_per_counter_with_units(connection: Connection) -> None:
    store = ReservationStore(connection)
    store.add_overdrafts("e-1", [("org", "calls", 0, 3), ("org", "tokens", 0, 0)], 9)
    store.add_overdrafts("e-2", [], 9)
    rows = connection.execute(
        select(overdrafts.c.event_id, overdrafts.c.limit_name, overdrafts.c.units)
    ).all()
    assert [tuple(row) for row in rows] == [("e-1", "calls", 3)]


def test_holds_on_a_limit_are_found_by_its_name_not_a_subject_of_that_name(
    connection: Connection,
) -> None:
    store = ReservationStore(connection)
    store.insert("r-1", [charge("org", "tokens"), charge("calls_x", "calls_y")], 10, 20)
    store.insert("r-2", [charge("calls", "images")], 10, 20)  # a subject named like a limit
    store.insert("r-3", [charge("org", "calls")], 10, 20)
    assert [store.holds_on(name) for name in ("tokens", "calls_y", "images")] == [True] * 3
    assert not store.holds_on("calls_")  # LIKE's "_" taken literally
    assert store.holds_on("calls")
    store.settle("r-3", COMMITTED, 15, "api")
    assert not store.holds_on("calls")  # settled: no longer held
    assert not store.holds_on("org")  # a subject, not a limit
