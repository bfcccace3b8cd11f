"""The SQLite hot path on stdlib sqlite3 connections of its own (issue 20, point 2).

`consume` and batches on a SQLite file run in a ``BEGIN IMMEDIATE``
transaction on a connection of `metering.storage.hot.sqlite.DirectSqlite`,
with no SQLAlchemy `Connection` or transaction object, notification marks
included; what needs one (dead letters, the limits' cache reloaded) runs
under SQLAlchemy. These tests hold that, and that a
process killed inside such a transaction loses nothing committed and leaves
nothing half-written.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from servers import copy_sqlite
from sqlalchemy import event, func, select

from metering import FrozenClock, Limit, Meter, make_event
from metering.storage.hot.sqlite import SqliteHotStore
from metering.storage.tables import breakers, counters, distinct_values, results, webhook_marks

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
LIMIT = Limit("calls", maximum=1_000, period="1d", window="calendar")


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(LIMIT)
        yield m


def sqlalchemy_activity(meter: Meter) -> list[str]:
    """Every transaction and statement the meter's SQLAlchemy engine runs from now on."""
    seen: list[str] = []
    event.listen(meter.sql_engine, "begin", lambda _connection: seen.append("BEGIN"))
    event.listen(
        meter.sql_engine,
        "before_cursor_execute",
        lambda _c, _cursor, statement, *_args: seen.append(statement),
    )
    return seen


def used(meter: Meter) -> tuple[int, int]:
    with meter.sql_engine.connect() as connection:
        count = connection.execute(select(func.count()).select_from(results)).scalar_one()
        total = connection.execute(select(func.sum(counters.c.used))).scalar_one()
    return count, total or 0


def test_consume_on_sqlite_uses_no_sqlalchemy_connection(meter: Meter) -> None:
    meter.consume("warm-up", "calls")  # the limits' cache is loaded under SQLAlchemy
    seen = sqlalchemy_activity(meter)
    statements: list[str] = []
    original = SqliteHotStore.read

    def traced_read(store: SqliteHotStore, *args: Any, **kwargs: Any) -> Any:
        store.raw.set_trace_callback(statements.append)
        return original(store, *args, **kwargs)

    SqliteHotStore.read = traced_read  # type: ignore[method-assign]
    try:
        decisions = [meter.consume(f"subject-{i % 3}", "calls") for i in range(20)]
        meter.apply_records([meter_event(i).record() for i in range(5)])
    finally:
        SqliteHotStore.read = original  # type: ignore[method-assign]
    assert all(d.allowed for d in decisions)
    assert seen == []  # not one SQLAlchemy transaction or statement
    # The stdlib connection ran the statements, and committed each transaction itself.
    # (Traced from the first read on: the first BEGIN IMMEDIATE is not seen.)
    assert statements.count("COMMIT") == 21  # 20 calls and a batch
    assert statements.count("BEGIN IMMEDIATE") == 20
    assert any(s.lstrip().startswith("INSERT INTO results") for s in statements)
    assert used(meter) == (26, 26)


def meter_event(index: int) -> Any:
    from metering.domain.events import make_event

    return make_event([("batch", "calls", 1)], NOW, f"batch-{index}", None)


def test_a_notice_is_written_on_the_direct_connection(sqlite_url: str) -> None:
    # The first denial of a window leaves a notification mark, written by the
    # direct store with the rest: SQLAlchemy runs nothing, and nothing is
    # written twice.
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("small", maximum=2, period="1d", window="calendar"))
        assert meter.consume("s", "small").allowed
        seen = sqlalchemy_activity(meter)
        assert meter.consume("s", "small").allowed
        assert seen == []
        assert not meter.consume("s", "small").allowed  # the first denial: a mark
        assert seen == []
        assert not meter.consume("s", "small").allowed
        with meter.sql_engine.connect() as connection:
            marks = connection.execute(select(func.count()).select_from(webhook_marks))
            assert marks.scalar_one() == 1
            denied = connection.execute(select(counters.c.denied_count)).scalar_one()
        assert denied == 2
        assert used(meter) == (4, 2)


def _killed_inside(url: str, ready: Any) -> None:
    """Child: commit 50 events, then stop inside the next transaction, after
    its writes and before its COMMIT, and wait there to be killed."""
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        for i in range(50):
            meter.consume(f"subject-{i % 5}", "calls", event_id=f"kept-{i}")
        original = SqliteHotStore.write

        def stop_after_write(store: SqliteHotStore, *args: Any, **kwargs: Any) -> None:
            original(store, *args, **kwargs)
            assert store.connection is None  # the direct path, not SQLAlchemy's
            ready.send("written")
            signal.pause()  # killed here

        SqliteHotStore.write = stop_after_write  # type: ignore[method-assign]
        meter.consume("subject-0", "calls", event_id="lost", cost=7)


def test_a_process_killed_inside_a_transaction_loses_nothing_committed(
    meter: Meter, sqlite_url: str
) -> None:
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    child = context.Process(target=_killed_inside, args=(sqlite_url, theirs))
    child.start()
    theirs.close()  # a child that dies early ends the pipe: recv raises EOFError
    assert ours.recv() == "written"
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join()
    assert child.exitcode == -signal.SIGKILL
    # Every committed event is there, the half-done one is not, and the
    # write lock it held is free: a new transaction goes through at once.
    assert used(meter) == (50, 50)
    with meter.sql_engine.connect() as connection:
        ids = set(connection.execute(select(results.c.event_id)).scalars())
    assert ids == {f"kept-{i}" for i in range(50)}
    assert meter.consume("subject-0", "calls", event_id="after").allowed
    raw = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    raw.close()
    assert used(meter) == (51, 51)


def _consume_in_child(meter: Meter, parent_connections: set[int], out: Any) -> None:
    direct = meter._engine.direct
    assert direct is not None
    meter.consume("child", "calls")
    mine = {id(c) for c in direct._open}
    out.send((bool(mine), bool(mine & parent_connections)))


def test_a_forked_process_opens_its_own_connections(meter: Meter) -> None:
    meter.consume("parent", "calls")
    direct = meter._engine.direct
    assert direct is not None
    parents = {id(c) for c in direct._open}
    assert parents
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    child = context.Process(target=_consume_in_child, args=(meter, parents, theirs))
    child.start()
    theirs.close()
    assert ours.recv() == (True, False)
    child.join()
    assert child.exitcode == 0
    # The parent's connection still works.
    assert meter.consume("parent", "calls").allowed
    assert used(meter) == (3, 3)


def test_close_closes_the_direct_connections(sqlite_url: str) -> None:
    meter = Meter(sqlite_url, clock=FrozenClock(NOW))
    meter.set_limit(LIMIT)
    meter.consume("s", "calls")
    direct = meter._engine.direct
    assert direct is not None
    opened = list(direct._open)
    assert opened
    meter.close()
    assert not direct._open
    for connection in opened:
        with pytest.raises(sqlite3.ProgrammingError):
            connection.execute("SELECT 1")


def test_threads_each_with_a_transaction_share_the_pool_exactly(sqlite_url: str) -> None:
    # Without group commit every thread runs its own BEGIN IMMEDIATE on a
    # pooled connection: they queue on SQLite's write lock, none is lost or
    # counted twice, and a hard limit holds exactly.
    with Meter(sqlite_url, clock=FrozenClock(NOW), group_commit=False) as meter:
        meter.set_limit(Limit("hard", maximum=300, period="1d", window="calendar"))
        meter.consume("warm-up", "hard")  # another subject: the cache is loaded

        def calls(thread: int) -> int:
            return sum(meter.consume("shared", "hard").allowed for _ in range(50))

        with ThreadPoolExecutor(8) as pool:
            allowed = sum(pool.map(calls, range(8)))
        direct = meter._engine.direct
        assert direct is not None
        assert 1 <= len(direct._open) <= 8  # one per thread at most
        with meter.sql_engine.connect() as connection:
            row = connection.execute(
                select(counters.c.used, counters.c.denied_count).where(
                    counters.c.subject == "shared"
                )
            ).one()
    assert allowed == 300
    assert tuple(row) == (300, 100)


def test_a_check_reads_on_the_direct_connection_without_the_write_lock(
    meter: Meter, sqlite_url: str
) -> None:
    """`check` reads in a plain ``BEGIN`` on a direct connection: SQLAlchemy
    runs nothing, and a writer holding SQLite's one write lock, its writes
    not committed, holds up no check, which sees what is committed."""
    meter.consume("s", "calls", 600)
    meter.check("s", "calls")  # the limits' cache is loaded
    seen = sqlalchemy_activity(meter)
    assert meter.check("s", "calls", 400).allowed
    assert seen == []
    writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE counters SET used = used + 300")
        assert meter.check("s", "calls", 400).allowed  # the 300 are not committed
        assert meter.check("s", "calls", 401).denied_by == ("calls",)
        writer.execute("ROLLBACK")
    finally:
        writer.close()
    assert seen == []
    assert used(meter) == (1, 600)


def _traced(meter: Meter, monkeypatch: pytest.MonkeyPatch, *args: Any, **kwargs: Any) -> list[str]:
    """The statements of one allowed `consume`, from its read to its COMMIT
    (each statement's first three words)."""
    statements: list[str] = []
    original = SqliteHotStore.read

    def traced(store: SqliteHotStore, *read: Any, **options: Any) -> Any:
        store.raw.set_trace_callback(statements.append)
        return original(store, *read, **options)

    monkeypatch.setattr(SqliteHotStore, "read", traced)
    assert meter.consume(*args, **kwargs).allowed
    monkeypatch.setattr(SqliteHotStore, "read", original)
    return [" ".join(statement.split()[:3]) for statement in statements]


def _table(meter: Meter, table: Any) -> list[tuple[Any, ...]]:
    """``table``'s rows, but a seat window's stamp (random: `HeldCache`)."""
    columns = [column for column in table.c if column.name != "seats_stamp"]
    with meter.sql_engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(select(*columns)))


BREAKER = Limit(
    "api",
    maximum=100_000,
    period="1d",
    window="calendar",
    breaker="10x",
    breaker_floor=0.1,
    quarantine_max=1000,
)


def test_a_breaker_consume_reads_its_breaker_and_secret_with_its_counter(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One statement reads the version, the counter, the breaker and the
    # secret (a breaker it read is updated by its rowid); what it read is
    # what the reference engine reads: a burst of 60 a second trips at the
    # same charge, and the breakers end the same.
    other = copy_sqlite(Path(sqlite_url.removeprefix("sqlite:///")), tmp_path / "other.db")
    clock = FrozenClock(NOW)
    with Meter(sqlite_url, clock=clock) as meter, Meter(other, clock=clock) as reference:
        reference._engine.paths = [reference._engine.path("reference")]
        denied: list[list[int]] = [[], []]
        for one in (meter, reference):
            one.set_limit(BREAKER)
        for second in range(70):
            for n, one in enumerate((meter, reference)):
                if not one.consume("s", "api", 60).allowed:
                    denied[n].append(second)
            clock.advance(seconds=1)
        assert denied[0] == denied[1] != []
        assert _table(meter, breakers) == _table(reference, breakers)
        assert _traced(meter, monkeypatch, "t", "api") == [
            "SELECT 0, v.version,",
            "INSERT INTO counters",
            "INSERT INTO results",
            "INSERT INTO breakers",
            "COMMIT",
        ]
        assert _traced(meter, monkeypatch, "t", "api") == [
            "SELECT 0, v.version,",
            "UPDATE counters SET",
            "INSERT INTO results",
            "UPDATE breakers SET",  # the row it read, by its rowid
            "COMMIT",
        ]


def test_a_seat_consume_reads_its_seat_with_its_counter(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One statement reads the version, the counter and the live events of a
    # value the meter does not know held: a value taken costs nothing again,
    # a third value is denied, as the reference engine decides; a taken
    # value's charge writes no counter.
    seats = Limit("seats", maximum=2, period="1mo", window="calendar", distinct="user")
    other = copy_sqlite(Path(sqlite_url.removeprefix("sqlite:///")), tmp_path / "other.db")
    clock = FrozenClock(NOW)
    with Meter(sqlite_url, clock=clock) as meter, Meter(other, clock=clock) as reference:
        reference._engine.paths = [reference._engine.path("reference")]
        for one in (meter, reference):
            one.set_limit(seats)
        for one in (meter, reference):
            decided = [
                one.consume("s", "seats", metadata={"user": user}).allowed
                for user in ("a", "b", "a", "c", "b")
            ]
            assert decided == [True, True, True, False, True]
        assert _table(meter, distinct_values) == _table(reference, distinct_values)
        assert _table(meter, counters) == _table(reference, counters)
        # "a" holds its seat: its row stays 1 (`HELD`), so a third event writes
        # none, and the meter knows it held while its window's stamp stands
        # (`HeldCache`): the version and counter alone are read.
        assert _traced(meter, monkeypatch, "s", "seats", metadata={"user": "a"}) == [
            "SELECT v.version, c.used,",
            "INSERT INTO results",
            "COMMIT",
        ]
        assert _traced(meter, monkeypatch, "t", "seats", metadata={"user": "a"}) == [
            "SELECT 0, v.version,",
            "INSERT INTO counters",
            "INSERT INTO results",
            "INSERT INTO distinct_values",
            # Traced again as its trigger's programs start (a new stamp, migration 0041).
            "INSERT INTO distinct_values",
            "INSERT INTO distinct_values",
            "COMMIT",
        ]


@pytest.mark.parametrize("granted", [False, True])
def test_a_consume_of_three_counters_reads_them_in_one_statement(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, granted: bool
) -> None:
    # The other counters (up to `_ONE_BY_ONE` in all) ride with the first
    # and the version (and a grant's rows), each row with its position: one
    # SELECT, whether each counter has a row or not; what it read is what
    # the reference engine reads.
    limits = [
        Limit(name, maximum=5, period=period, window="calendar")
        for name, period in (("calls", "1mo"), ("daily", "1d"), ("weekly", "1w"))
    ]
    charges = [("s", limit.name, 2) for limit in limits]
    other = copy_sqlite(Path(sqlite_url.removeprefix("sqlite:///")), tmp_path / "other.db")
    clock = FrozenClock(NOW)
    with Meter(sqlite_url, clock=clock) as meter, Meter(other, clock=clock) as reference:
        reference._engine.paths = [reference._engine.path("reference")]
        for one in (meter, reference):
            for limit in limits:
                one.set_limit(limit)
            if granted:
                one.grant("s", "calls", 3, grant_id="g")
            one.consume("s", "daily", 1)  # one counter has a row, the others not yet
        traced = _traced(meter, monkeypatch, charges=charges)
        assert [statement for statement in traced if statement.startswith("SELECT")] == [
            "SELECT 0, v.version,"
        ]
        assert traced.count("INSERT INTO counters") == 2
        reference.consume(charges=charges)
        for _ in range(2):
            decided = [one.consume(charges=charges) for one in (meter, reference)]
            assert [d.outcome for d in decided] == [d.outcome for d in decided[::-1]]
            assert decided[0].charges == decided[1].charges
        assert _table(meter, counters) == _table(reference, counters)


@pytest.mark.parametrize("groups", [0, 8])
def test_a_batchs_counters_and_seat_values_read_the_same_grouped_or_by_whole_key(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, groups: int
) -> None:
    # Read by (limit, window start) groups of subjects when there are few
    # groups, else by whole keys: the same rows either way, none for a key
    # without one.
    from metering.storage.hot import sqlite as hot

    seats = Limit("seats", maximum=50, period="1mo", window="calendar", distinct="user")
    weekly = Limit("weekly", maximum=1_000, period="1w", window="calendar")
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits([LIMIT, seats, weekly])
        events = [
            make_event(
                [(f"org-{n % 7}", "calls"), (f"org-{n % 7}", "seats"), (f"org-{n}", "weekly")],
                NOW,
                metadata={"user": f"u{n % 3}"},
            )
            for n in range(12)
        ]
        assert all(decision.allowed for decision in meter.apply(events))
    raw = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        stored = {
            row[:3]: list(row[3:])
            for row in raw.execute(
                "SELECT limit_name, subject, window_start_us, used, denied_count, denied_cost,"
                " first_denied_at_us, tat_us, tat_rem, tat_scale, rate, rate_at_us, granted,"
                " seats_stamp FROM counters"
            )
        }
        live = {
            (name, subject, start, value): n
            for subject, name, start, value, n in raw.execute(
                "SELECT subject, limit_name, window_start_us, value, live_events"
                " FROM distinct_values"
            )
        }
        monkeypatch.setattr(hot, "_GROUPS", groups)
        start = next(iter(stored))[2]
        wanted = [*stored, ("calls", "x", start)]
        found = {key: list(row) for key, row in hot._counters(raw, wanted)}
        month = next(iter(live))[2]
        seen = hot._seen(raw, [*live, ("seats", "x", month, "u0")], {})
    finally:
        raw.close()
    assert len(stored) == 7 + 7 + 12
    assert len(live) == len({(n % 7, n % 3) for n in range(12)})
    assert found == stored
    assert seen == live
