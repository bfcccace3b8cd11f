"""The values known held (`HeldCache`): a batch reads only the seat values
it knows nothing of while their window's stamp stands, on both stores, and
the one-trip function (PostgreSQL) takes a value as held on the stamp it is
told. Every change of a window's held values moves its stamp, whoever writes
it, so a value freed or a database restored under a meter is read again and
never lets seats past a hard maximum."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from decision_paths import apply_reference, without
from sqlalchemy import Engine, insert, text

from metering import FrozenClock, Limit, Meter
from metering.domain.events import UsageEvent, make_event
from metering.engine.limit_cache import LimitCache
from metering.engine.one_trip import STATS, prepare
from metering.engine.seats import HeldCache
from metering.storage.connections import make_engine
from metering.storage.hot import Snapshot, WantedSeat
from metering.storage.hot.postgres import PostgresHotStore
from metering.storage.hot.sqlite import SqliteHotStore
from metering.storage.tables import counters, distinct_values
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def _event(event_id: str, user: str) -> UsageEvent:
    return make_event([("org-1", "seats", 1)], NOW, event_id, {"user": user})


def _allowed(meter: Meter, *users: tuple[str, str]) -> list[bool]:
    return [d.allowed for d in meter.apply([_event(e, u) for e, u in users])]


def _stamp(engine: Engine) -> Any:
    with engine.connect() as connection:
        query = "SELECT seats_stamp FROM counters WHERE limit_name = 'seats'"
        return connection.execute(text(query)).scalar()


def _held(meter: Meter) -> LimitCache:
    cache = meter._engine.path("direct").cache
    assert isinstance(cache, LimitCache)
    return cache


def test_every_take_and_free_of_a_seat_moves_its_windows_stamp(db_url: str) -> None:
    engine = make_engine(db_url)
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits([Limit("seats", 10, "1mo", window="calendar", distinct="user")])
        assert _allowed(meter, ("a1", "u1"), ("a2", "u2")) == [True, True]  # the fast path
        taken = _stamp(engine)
        assert taken is not None
        assert _allowed(meter, ("a3", "u1"), ("a4", "u2")) == [True, True]
        assert _stamp(engine) == taken  # held values: nothing written
        seen = {taken}
        meter.consume("org-1", "seats", metadata={"user": "u3"})  # PostgreSQL: one trip
        assert _stamp(engine) not in seen
        seen.add(_stamp(engine))
        without(meter._engine, "one_trip")
        without(meter._engine, "direct")
        record = _event("r1", "u4").record()
        answer = apply_reference(meter._engine, [record], meter.database.now_us())[0]
        assert answer.record is not None and answer.record.outcome == "allowed"
        assert _stamp(engine) not in seen
        seen.add(_stamp(engine))
        meter.void("r1", "wrong user")  # u4's only event: its seat is freed
        assert _stamp(engine) not in seen
        seen.add(_stamp(engine))
        meter.void("a1", "wrong user")  # u1 still has a3: nothing changes
        assert _stamp(engine) in seen
        meter.void("a3", "wrong user")
        assert _stamp(engine) not in seen
        meter.reset("org-1", "seats")
        assert _stamp(engine) is None  # no counter: nothing known
    engine.dispose()


def _backup(url: str) -> Callable[[], None]:
    """Save the database now; the function returned puts it back as a restore
    would, behind the triggers' back, so the stamps are the saved ones: on
    PostgreSQL the counters and values with the triggers off (``pg_restore
    --disable-triggers``), on SQLite the whole file (the backup API copies
    its pages, no statement runs)."""
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        saved = sqlite3.connect(":memory:")
        with closing(sqlite3.connect(path)) as source:
            source.backup(saved)

        def put_back() -> None:
            with closing(sqlite3.connect(path)) as target:
                saved.backup(target)

        return put_back
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = [
            (table, [dict(row) for row in connection.execute(table.select()).mappings()])
            for table in (counters, distinct_values)
        ]

    def restore() -> None:
        with engine.begin() as connection:
            connection.execute(text("SET LOCAL session_replication_role = replica"))
            for table, saved in rows:
                connection.execute(table.delete())
                connection.execute(insert(table), saved)
        engine.dispose()

    return restore


def test_a_restored_database_never_lets_seats_past_the_maximum(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits([Limit("seats", 3, "1mo", window="calendar", distinct="user")])
        assert _allowed(meter, ("a1", "u1"), ("a2", "u2")) == [True, True]
        assert _allowed(meter, ("b1", "u1"), ("b2", "u2")) == [True, True]
        restore = _backup(db_url)  # u1 and u2 held
        assert _allowed(meter, ("c1", "u3")) == [True]
        assert _allowed(meter, ("d1", "u1"), ("d2", "u2"), ("d3", "u3")) == [True, True, True]
        known = _held(meter).held.windows
        assert [sorted(values) for _, values in known.values()] == [["u1", "u2", "u3"]]
        restore()
        # u3 is known held, but not in the restored window: it takes the third seat.
        assert _allowed(meter, ("f1", "u3"), ("f2", "u4")) == [True, False]
        assert [c.used for c in meter.counters("org-1", "seats")] == [3]


def _store(url: str) -> tuple[type[PostgresHotStore | SqliteHotStore], str]:
    """The hot store of ``url``'s database and its method that reads with the counters."""
    if url.startswith("sqlite"):
        return SqliteHotStore, "read"
    return PostgresHotStore, "read_rows"


def test_a_batch_reads_only_the_values_it_does_not_know_held(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[tuple[str, int]] = []
    store, with_counters = _store(db_url)
    read_rows, read_seats, read_held = (
        getattr(store, with_counters),
        store.read_seats,
        store.read_held,
    )

    def rows(store: Any, *args: Any, **options: Any) -> Any:
        read.append(("with the counters", len(args[0].seats)))
        return read_rows(store, *args, **options)

    def seats(store: Any, wanted: Any) -> Any:
        read.append(("after them", len(wanted)))
        return read_seats(store, wanted)

    def held(store: Any, windows: Any) -> Any:
        found = read_held(store, windows)
        read.append(("whole windows", sum(map(len, found.values()))))
        return found

    monkeypatch.setattr(store, with_counters, rows)
    monkeypatch.setattr(store, "read_seats", seats)
    monkeypatch.setattr(store, "read_held", held)
    limit = Limit("seats", 10, "1mo", window="calendar", distinct="user")
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits([limit])
        _allowed(meter, ("a1", "u1"), ("a2", "u2"), ("a3", "u3"))  # taken: forgotten
    read.clear()
    with (
        Meter(db_url, clock=FrozenClock(NOW)) as meter,
        Meter(db_url, clock=FrozenClock(NOW)) as other,
    ):
        _allowed(meter, ("b1", "u1"), ("b2", "u2"))  # met first: read whole
        _allowed(meter, ("c1", "u2"), ("c2", "u3"))  # held: known
        _allowed(other, ("d1", "u4"))  # another meter takes a seat: the stamp moves
        _allowed(meter, ("e1", "u1"), ("e2", "u2"), ("e3", "u4"))
        _allowed(meter, ("f1", "u1"), ("f2", "u4"))
    # On PostgreSQL the other meter's one event goes in one trip (no store read).
    other_read = [("with the counters", 1), ("whole windows", 3)] if store is SqliteHotStore else []
    assert read == [
        ("with the counters", 2),
        ("whole windows", 3),
        ("with the counters", 0),
        *other_read,
        ("with the counters", 1),  # u4; u1 and u2 known, but their stamp moved:
        ("after them", 2),
        ("with the counters", 0),
    ]


def test_a_window_with_more_seats_than_the_bound_is_not_read_whole(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole: list[Any] = []
    store, _ = _store(db_url)
    read_held = store.read_held

    def held(store: Any, windows: Any) -> Any:
        whole.append(windows)
        return read_held(store, windows)

    limit = Limit("seats", 10, "1mo", window="calendar", distinct="user")
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits([limit])
        _allowed(meter, ("a1", "u1"), ("a2", "u2"), ("a3", "u3"))
    monkeypatch.setattr(store, "read_held", held)
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        _held(meter).held.warm = 2
        assert _allowed(meter, ("b1", "u1"), ("b2", "u2")) == [True, True]
        assert _allowed(meter, ("c1", "u3"), ("c2", "u4")) == [True, True]
        assert [c.used for c in meter.counters("org-1", "seats")] == [4]
    assert whole == []


def test_a_value_known_held_but_freed_since_takes_its_seat_again_in_one_trip(
    pg_url: str,
) -> None:
    engine = make_engine(pg_url)
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits([Limit("seats", 10, "1mo", window="calendar", distinct="user")])
        tried = STATS["applied"]
        user = {"user": "u1"}
        taken = meter.consume("org-1", "seats", metadata=user, event_id="e1")
        held = meter.consume("org-1", "seats", metadata=user, event_id="e2")
        assert [taken.charges[0].cost, held.charges[0].cost] == [1, 0]
        # The function answered the stamp it found u1 held at.
        stamp = _stamp(engine)
        assert list(_held(meter).held.windows.values()) == [(stamp, frozenset({"u1"}))]
        meter.void("e1", "wrong user")
        meter.void("e2", "wrong user")  # u1's last live event: its seat is freed
        assert meter.seats("org-1", "seats") == [] and _stamp(engine) != stamp
        # The meter still knows u1 held at the old stamp, and says so to the function.
        record = make_event([("org-1", "seats", 1)], NOW, "e3", user).record()
        parameters = prepare(_held(meter), record, meter.database.now_us())
        assert isinstance(parameters, tuple) and json.loads(parameters[6])[0][23] == stamp
        again = meter.consume("org-1", "seats", metadata=user, event_id="e3")
        assert again.charges[0].cost == 1  # read under the counter's lock: taken again
        assert STATS["applied"] - tried == 3
        assert meter.seats("org-1", "seats") == ["u1"]
        assert [c.used for c in meter.counters("org-1", "seats")] == [1]
    # Two minutes on: the audit checks what was decided up to a minute before.
    with Meter(pg_url, clock=FrozenClock(NOW + timedelta(minutes=2))) as later:
        assert run_audit(later, full=True).violations == ()
    engine.dispose()


def test_one_seat_value_on_sqlite_beside_a_grant_is_learnt_from_its_counters_read(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a grant the read is folded anyway (`FOLDED`): the value's row rides
    # with it and is learnt; its window is never read whole.
    whole: list[Any] = []
    read_held = SqliteHotStore.read_held

    def held(store: Any, windows: Any) -> Any:
        whole.append(windows)
        return read_held(store, windows)

    monkeypatch.setattr(SqliteHotStore, "read_held", held)
    engine = make_engine(sqlite_url)

    def consume(meter: Meter, user: str) -> int:
        charges = [("org-1", "calls", 1), ("org-1", "seats", 1)]
        decision = meter.consume(charges=charges, metadata={"user": user})
        return decision.charges[1].cost

    with (
        Meter(sqlite_url, clock=FrozenClock(NOW)) as meter,
        Meter(sqlite_url, clock=FrozenClock(NOW)) as other,
    ):
        meter.set_limits(
            [
                Limit("calls", 100, "1mo", window="calendar"),
                Limit("seats", 10, "1mo", window="calendar", distinct="user"),
            ]
        )
        meter.grant("org-1", "calls", 50)
        windows = _held(meter).held.windows
        assert consume(meter, "u1") == 1
        assert windows == {}  # taken: its stamp moved
        assert consume(other, "u2") == 1
        assert consume(meter, "u1") == 0
        [(key, (stamp, values))] = windows.items()
        assert (stamp, values) == (_stamp(engine), {"u1"})  # read held with its counter
        assert consume(meter, "u2") == 0
        assert windows[key] == (stamp, {"u1", "u2"})
        assert consume(other, "u3") == 1  # the stamp moves
        assert consume(meter, "u1") == 0
        assert windows[key] == (_stamp(engine), {"u1"})  # read again, learnt anew
        # A value known at a stamp the window no longer shows is read.
        windows[key] = (stamp, values | {"u4"})
        assert consume(meter, "u4") == 1
        assert [c.used for c in meter.counters("org-1", "seats")] == [4]
    assert whole == []
    engine.dispose()


def test_a_value_assumed_held_is_read_when_a_newer_stamp_was_learnt_meanwhile() -> None:
    """A batch assumes a value held at the stamp it knew (`HeldCache.split`);
    if another batch learns the window at a newer stamp (the value freed)
    before the read shows that stamp, the value is read, not taken as held."""
    key, seat = ("seats", "acme", 0), ("seats", "acme", 0, "user-1")
    held = HeldCache()
    held.learn(key, 1, "user-1")
    asked, assumed = held.split([seat])
    assert not asked
    held.learn(key, 2, "user-2")  # another batch: user-1 freed, the stamp moved
    snapshot = Snapshot(1, {}, {}, {key: [1, 0, 0, 0, 0, 0, 0]}, stamps={key: 2})
    read: list[list[WantedSeat]] = []

    def read_seats(seats: Any) -> dict[Any, int]:
        read.append(list(seats))
        return {}

    held.settle(asked, assumed, snapshot, read_seats, lambda keys: {})
    assert read == [[seat]]
    assert seat not in snapshot.seen
