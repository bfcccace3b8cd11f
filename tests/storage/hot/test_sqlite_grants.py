"""The SQLite hot path's statements of grants (`metering/storage/hot/sqlite_grants.py`)
do what `metering.storage.allowances` and `metering.storage.recurring` do through
SQLAlchemy: the same pots and draws read, for a few pairs one by one and for
many in one statement; draws added alike; the same recurring issues made, the
schedules moved on. A granted `consume` reads its grants with its counter."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from servers import copy_sqlite
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.grants import Pot
from metering.storage.allowances import AllowanceStore, drawn_by_window, grant_deltas
from metering.storage.hot.sqlite import SqliteHotStore
from metering.storage.hot.sqlite_grants import (
    Rowids,
    due_schedules,
    read_grants,
    with_draws,
    write_draws,
    write_issues,
)
from metering.storage.recurring import issue_due, issues_of
from metering.storage.tables import counters, grant_schedules, grants, limits_version

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SUBJECTS = ["a", "b", "c", "d", "e"]


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(sqlite_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=2, period="1h", window="calendar"))
        for n, subject in enumerate(SUBJECTS):
            meter.grant(subject, "calls", 10 + n, grant_id=f"g-{subject}", low=3)
            meter.grant(subject, "calls", 5, grant_id=f"p-{subject}", priority=1)
            meter.consume(subject, "calls", 4 + n)  # grants pay past the maximum
        yield meter


@contextlib.contextmanager
def raw_of(meter: Meter) -> Iterator[sqlite3.Connection]:
    path = meter.url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as raw:
        raw.execute("BEGIN IMMEDIATE")
        yield raw
        raw.execute("COMMIT")


def _pots(meter: Meter, pairs: list[tuple[str, str]]) -> Any:
    with meter.sql_engine.connect() as connection:
        return AllowanceStore(connection).lock_pots(pairs, None, lock=False)


@pytest.mark.parametrize("count", [2, 5], ids=["one-by-one", "as-json"])
def test_the_pots_read_are_the_allowance_stores(meter: Meter, count: int) -> None:
    pairs = [("calls", subject) for subject in SUBJECTS[:count]] + [("calls", "nobody")]
    with raw_of(meter) as raw:
        pots, watched = read_grants(raw, pairs)
        assert not any(pot.granted for pot in pots.values())  # the counters' (`with_draws`)
        drawn = raw.execute("SELECT limit_name, subject, window_start_us, granted FROM counters")
        with_draws(pots, {(name, subject, start): n for name, subject, start, n in drawn if n})
    # Those not used up (e's "p-e" is); a pair asked with none left has an empty pot.
    expected = {
        pair: Pot([b for b in pot.balances if b.left > 0], pot.granted)
        for pair, pot in _pots(meter, pairs).items()
    }
    assert pots == {**expected, ("calls", "nobody"): Pot([])} and len(pots) == count + 1
    if count == len(SUBJECTS):
        assert [b.grant_id for b in pots[("calls", "e")].balances] == ["g-e"]
    assert all(pots[pair].granted for pair in pairs[:-1])  # each window drew on its grants
    assert sorted(watched) == [f"g-{subject}" for subject in SUBJECTS[:count]]
    used = {b.grant_id: b.used for b in pots[("calls", "a")].balances}
    assert used == {"p-a": 2, "g-a": 0}  # a drew 2 past its maximum, priority 1 first
    assert watched["g-a"] == (3, 0)  # (low at, used), until grant.low is sent


def test_draws_are_added_to_the_grants(meter: Meter) -> None:
    # The window's share is its counter's (``granted``), written with the counter.
    start = int(NOW.timestamp()) * 1_000_000
    before = _pots(meter, [("calls", "a")])[("calls", "a")]
    with raw_of(meter) as raw:
        write_draws(raw, {("calls", "a", start, "g-a"): 3, ("calls", "a", start, "p-a"): 1})
        write_draws(raw, {("calls", "a", start, "g-a"): 1})
    after = _pots(meter, [("calls", "a")])[("calls", "a")]
    assert after.granted[start] == before.granted[start]
    used = {b.grant_id: b.used for b in after.balances}
    assert used == {"g-a": 4, "p-a": 2 + 1}


def test_draws_on_rows_read_are_added_by_rowid(meter: Meter) -> None:
    # Many pairs are read a limit at a time, with their rows' rowids; the
    # draws then update those rows by rowid, and the others by their key.
    start = int(NOW.timestamp()) * 1_000_000
    pairs = [("calls", subject) for subject in SUBJECTS]
    statements: list[str] = []
    before = _pots(meter, pairs)[("calls", "a")]
    with raw_of(meter) as raw:
        rowids = Rowids()
        read_grants(raw, pairs, rowids)
        live = [
            f"{g}-{s}" for g in "gp" for s in SUBJECTS if (g, s) not in {("p", "d"), ("p", "e")}
        ]
        assert sorted(rowids.grants) == sorted(live)  # (d and e used their "p" up)
        raw.set_trace_callback(statements.append)
        write_draws(raw, {("calls", "a", start, "g-a"): 2, ("calls", "a", start, "p-a"): 1}, rowids)
        write_draws(raw, {("calls", "a", start, "g-a"): 1}, rowids)  # one draw (`consume`'s)
        raw.set_trace_callback(None)
    by_rowid = "UPDATE grants SET used = used + {} WHERE rowid = {}"
    assert [" ".join(statement.split()) for statement in statements] == [
        by_rowid.format(2, rowids.grants["g-a"]),
        by_rowid.format(1, rowids.grants["p-a"]),
        by_rowid.format(1, rowids.grants["g-a"]),
    ]
    after = _pots(meter, pairs)[("calls", "a")]
    assert {b.grant_id: b.used for b in after.balances} == {"g-a": 3, "p-a": 3}
    assert after.granted[start] == before.granted[start]


@pytest.mark.parametrize("count", [1, 3])
def test_the_deltas_of_draws_are_their_sums(count: int) -> None:
    # One draw (most batches) is found without the loop for many: the same sums.
    draws = {("calls", "a", 10 * (n // 2), f"g-{n % 2}"): n + 1 for n in range(count)}
    by_grant: dict[str, int] = {}
    by_window: dict[tuple[str, str, int], int] = {}
    for (name, subject, start, grant_id), amount in draws.items():
        by_grant[grant_id] = by_grant.get(grant_id, 0) + amount
        by_window[(name, subject, start)] = by_window.get((name, subject, start), 0) + amount
    assert grant_deltas(draws) == sorted(by_grant.items())
    assert dict(drawn_by_window(draws)) == by_window
    only = [(g, a) for g, a in sorted(by_grant.items()) if g == "g-1"]
    assert grant_deltas(draws, {"g-1"}) == only


def _state(url: str) -> tuple[list[Any], list[Any], int]:
    with Meter(url) as meter, meter.sql_engine.connect() as connection:
        made = connection.execute(select(grants).order_by(grants.c.grant_id)).all()
        moved = connection.execute(select(grant_schedules)).all()
        version = connection.execute(select(limits_version.c.version)).scalar_one()
    return [tuple(row) for row in made], [tuple(row) for row in moved], int(version)


def test_recurring_issues_are_made_as_the_recurring_store_makes_them(
    meter: Meter, clock: FrozenClock, tmp_path: Path
) -> None:
    meter.grant("r", "calls", 7, every="1h", grant_id="monthly")
    clock.advance(hours=3, minutes=10)
    now_us = meter.database.now_us()
    pairs = [("calls", "r"), ("calls", "a")]
    other = copy_sqlite(Path(meter.url.removeprefix("sqlite:///")), tmp_path / "other.db")
    with raw_of(meter) as raw:
        due = due_schedules(raw, pairs)  # the pairs' schedules, due or not
        assert [schedule.subject for schedule, _ in due] == ["r"]
        issued = [(schedule, issues_of(schedule, last, now_us)) for schedule, last in due]
        assert [len(issues) for _, issues in issued] == [3]
        write_issues(raw, issued, now_us)
    with Meter(other, clock=clock) as by_store, by_store.sql_engine.begin() as connection:
        assert issue_due(connection, pairs, now_us) == 3
    assert _state(meter.url) == _state(other)
    hour_later = now_us + int(timedelta(hours=1).total_seconds() * 1e6)
    with raw_of(meter) as raw:
        moved = due_schedules(raw, pairs)
    assert [issues_of(schedule, last, now_us) for schedule, last in moved] == [[]]  # moved on
    assert [len(issues_of(schedule, last, hour_later)) for schedule, last in moved] == [1]


def _statements(
    meter: Meter, monkeypatch: pytest.MonkeyPatch, subject: str, whole: bool = False
) -> list[str]:
    """The statements of one `consume` of ``subject``, from its read to its
    COMMIT: their first words (``whole``: as run, with their values)."""
    statements: list[str] = []
    original = SqliteHotStore.read

    def traced(store: SqliteHotStore, *args: Any, **kwargs: Any) -> Any:
        store.raw.set_trace_callback(statements.append)
        return original(store, *args, **kwargs)

    monkeypatch.setattr(SqliteHotStore, "read", traced)
    assert meter.consume(subject, "calls").allowed
    monkeypatch.setattr(SqliteHotStore, "read", original)
    if whole:
        return statements
    by_rowid = {True: " by rowid", False: ""}
    return [
        " ".join(statement.split()[:3]) + by_rowid["WHERE rowid =" in statement]
        for statement in statements
    ]


@pytest.mark.parametrize("every", [None, "1mo"], ids=["grant", "recurring"])
def test_a_granted_consume_reads_its_grants_with_its_counter(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, every: str | None
) -> None:
    # One statement reads the version, the counter, the grants and their
    # draws with their rowids; the grant's use and its window's draw are two
    # statements, each of a row found by its rowid.
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1mo", window="calendar"))
        meter.grant("s", "calls", 10, grant_id="credit", every=every)
        assert meter.consume("s", "calls").allowed  # the limit's own
        assert meter.consume("s", "calls").allowed  # the grant's first
        statements = _statements(meter, monkeypatch, "s")
        assert statements == [
            "SELECT 0, v.version,",
            "UPDATE counters SET",
            "INSERT INTO results",
            "UPDATE grants SET by rowid",
            "COMMIT",
        ]
        with meter.sql_engine.connect() as connection:
            used = connection.execute(select(grants.c.used)).scalar_one()
            drawn = connection.execute(select(counters.c.granted)).scalar_one()
        assert (used, drawn) == (2, 2)


def test_a_granted_consume_searches_its_counters_once(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the window drew on the grants is its counter's ``granted``, read
    # with the counter: the read searches the grants once and the counters
    # once, not the pair's counters again for their draws.
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1mo", window="calendar"))
        meter.grant("s", "calls", 10, grant_id="credit")
        assert meter.consume("s", "calls").allowed  # the limit's own
        assert meter.consume("s", "calls").allowed  # the grant's first
        read = _statements(meter, monkeypatch, "s", whole=True)[0]
        with raw_of(meter) as raw:
            plan = [row[3] for row in raw.execute(f"EXPLAIN QUERY PLAN {read}")]
        assert [step.split(" USING")[0] for step in plan if step.startswith("SEARCH")] == [
            "SEARCH v",
            "SEARCH c",
            "SEARCH grants",
        ]
        assert [grant.used for grant in meter.grants("s", "calls")] == [2]
