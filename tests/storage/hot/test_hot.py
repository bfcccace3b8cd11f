"""The hot path's storage contract (`metering/storage/hot/__init__.py`), held
by the store `hot_store` picks on each database: `HotStore.read` returns the
limits' version, the stored results of the ids asked for, each pair's current
first-use window with its counter, and the counters that exist (a few keys or
many); `HotStore.write` stores counters created and updated, windows new and
moved, results, held and settled reservations, after a read of them in the
same transaction; an id decided meanwhile fails the write on the results'
key (an `IntegrityError` that `Database.run` retries) and writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from metering import FrozenClock, Limit, Meter
from metering.domain.reservations import HeldCharge, ReservationState
from metering.storage.hot import Changes, ReadRequest, Snapshot
from metering.storage.hot.pick import hot_store
from metering.storage.reservations import hold_row, settle_row
from metering.storage.results import ResultRecord

HOUR = 3_600_000_000
NOW = 1_795_000_000 * 1_000_000
START = NOW - NOW % HOUR
MONTH = "2026-11"  # the counters' billing month (2026-11-18 in UTC)
SUBJECTS = [f"org-{n}" for n in range(5)]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _result(event_id: str) -> ResultRecord:
    charges = [["org-0", "calls", 1, "allowed", 1, 9, START + HOUR]]
    return ResultRecord(
        event_id, "allowed", '[["org-0","calls",1]]', NOW, NOW, (), None, charges, None
    )


def _read(meter: Meter, ids: list[str] | None = None) -> Snapshot:
    def work(connection: Connection) -> Snapshot:
        keys = [("calls", subject, START, START + HOUR) for subject in SUBJECTS]
        return hot_store(connection).read(
            ReadRequest(ids, [("fu", "org-0"), ("fu", "org-1")], keys)
        )

    return meter.database.run(work)


def _write(meter: Meter, changes: Changes) -> None:
    """Read, then write in the same transaction (the read locks what the write changes)."""

    def work(connection: Connection) -> None:
        store = hot_store(connection)
        keys = [("calls", subject, START, START + HOUR) for subject in SUBJECTS]
        store.read(ReadRequest(None, [("fu", "org-0"), ("fu", "org-1")], keys))
        store.write(changes, NOW, commit=False)

    meter.database.run(work)


def _windows(snapshot: Snapshot) -> dict[Any, Any]:
    """The pairs that have a window."""
    return {pair: window for pair, window in snapshot.windows.items() if window is not None}


def _state(used: int) -> list[Any]:
    return [used, 0, 0, None, None, 0, 1]


def test_nothing_stored_reads_as_nothing_but_the_version(meter: Meter) -> None:
    snapshot = _read(meter, ["e-1"])
    assert snapshot.version >= 0
    assert (snapshot.stored, snapshot.states) == ({}, {})
    assert _windows(snapshot) == {}


def test_a_pair_with_no_window_row_is_left_out_on_every_store(meter: Meter) -> None:
    assert _read(meter).windows == {}
    _write(
        meter,
        Changes(
            created=[(("fu", "org-0", NOW), NOW + HOUR, _state(1), MONTH)],
            new_windows=[(("fu", "org-0"), (NOW, NOW + HOUR))],
        ),
    )
    assert _read(meter).windows == {("fu", "org-0"): (NOW, NOW + HOUR)}

    def work(connection: Connection) -> Snapshot:
        pairs = [("fu", subject) for subject in SUBJECTS]  # past the one-by-one reads
        return hot_store(connection).read(ReadRequest(None, pairs, []))

    assert meter.database.run(work).windows == {("fu", "org-0"): (NOW, NOW + HOUR)}


def test_what_a_store_wrote_it_reads_back(meter: Meter) -> None:
    version = _read(meter).version
    created = [
        (("calls", subject, START), START + HOUR, _state(n + 1), MONTH)
        for n, subject in enumerate(SUBJECTS)
    ]
    _write(
        meter,
        Changes(
            created=[*created, (("fu", "org-0", NOW), NOW + HOUR, _state(4), MONTH)],
            new_windows=[(("fu", "org-0"), (NOW, NOW + HOUR))],
            results=[_result("e-1")],
        ),
    )
    snapshot = _read(meter, ["e-1", "e-2"])
    assert snapshot.version == version  # counters are not limits
    assert list(snapshot.stored) == ["e-1"]
    assert snapshot.stored["e-1"].outcome == "allowed"
    assert _windows(snapshot) == {("fu", "org-0"): (NOW, NOW + HOUR)}
    used = {key: state[0] for key, state in snapshot.states.items()}
    assert used == {
        **{("calls", subject, START): n + 1 for n, subject in enumerate(SUBJECTS)},
        ("fu", "org-0", NOW): 4,  # the current window's counter rides along
    }
    later = NOW + HOUR
    _write(
        meter,
        Changes(
            updated=[(("calls", "org-0", START), _state(7))],
            created=[(("fu", "org-0", later), later + HOUR, _state(1), MONTH)],
            moved_windows=[(("fu", "org-0"), (later, later + HOUR))],
        ),
    )
    moved = _read(meter)
    assert moved.windows[("fu", "org-0")] == (later, later + HOUR)
    assert moved.states[("calls", "org-0", START)][0] == 7
    assert moved.states[("fu", "org-0", later)][0] == 1


def test_a_request_of_counters_alone_reads_nothing_else_and_grants_unbounded(
    db_url: str,
) -> None:
    day = timedelta(days=1)
    at = datetime.fromtimestamp(NOW / 1_000_000, UTC)
    with Meter(db_url, clock=FrozenClock(at - 2 * day)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        meter.grant("org-0", "calls", 5, at - day, grant_id="expired")
        keys = [("calls", "org-0", START, START + HOUR)]

        def read(request: ReadRequest) -> Snapshot:
            return meter.database.run(lambda connection: hot_store(connection).read(request))

        alone = read(ReadRequest(None, [], keys))
        assert (alone.pots, alone.seen, alone.schedules, alone.breakers) == ({}, {}, [], {})
        granted = [("calls", "org-0")]
        # By default every grant not used up is read, expired or not (`ALL_GRANTS`).
        pot = read(ReadRequest(None, [], keys, granted)).pots[granted[0]]
        assert [balance.grant_id for balance in pot.balances] == ["expired"]
        bounded = read(ReadRequest(None, [], keys, granted, grants_since_us=NOW))
        assert bounded.pots[granted[0]].balances == []


def test_an_id_decided_meanwhile_fails_the_write_to_be_retried(meter: Meter) -> None:
    _write(meter, Changes(results=[_result("e-1")]))
    changes = Changes(
        results=[_result("e-1")],
        created=[(("calls", "org-0", START), START + HOUR, _state(1), MONTH)],
    )
    with (
        pytest.raises(IntegrityError) as raised,
        meter.sql_engine.begin() as connection,
    ):
        store = hot_store(connection)
        store.read(ReadRequest(None, [], [("calls", "org-0", START, START + HOUR)]))
        store.write(changes, NOW, commit=False)
    assert "results" in str(raised.value)  # the results' key: `Database.run` retries it
    assert _read(meter).states == {}  # nothing of the write stayed


def test_reservations_are_held_and_settled_with_the_results(meter: Meter) -> None:
    charge = HeldCharge("org-0", "calls", 1, START, START + HOUR)
    _write(
        meter, Changes(results=[_result("r-1")], holds=[hold_row("r-1", [charge], NOW, NOW + 5)])
    )
    held = meter.database.run(lambda connection: hot_store(connection).lock_reservation("r-1"))
    assert held is not None and held.state == ReservationState.HELD
    assert held.charges == (charge,)
    settled = settle_row("r-1", ReservationState.COMMITTED, NOW + 1, "api")
    _write(meter, Changes(settled=[settled]))
    found = meter.reservation("r-1")
    assert found is not None and found.state == ReservationState.COMMITTED
    assert (
        meter.database.run(lambda connection: hot_store(connection).lock_reservation("r-2")) is None
    )
