"""The usage rollups' statements (`storage/rollups.py`) on SQLite and
PostgreSQL: deltas add up (a negative one takes back), a batch's are
appended and folded in by a compaction that changes no sum, and the
group-by report sums one subject's hours per limit and value, largest
first, leaving out what was all taken back. Two writers' batches racing a
compaction that runs over and over count each allowed event once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Table, func, select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.domain.rollups import Delta, RollupKey, hour_start_us
from metering.storage.results import record_from_row
from metering.storage.rollups import (
    ROLLUPS,
    DimensionQuery,
    compact_rollups,
    count_of,
    record_rollups,
    usage_by_statement,
)
from metering.storage.tables import results, usage_rollup_deltas, usage_rollups

HOUR = 3_600_000_000


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _record(meter: Meter, deltas: dict[RollupKey, Delta]) -> None:
    meter.database.run(lambda connection: record_rollups(connection, deltas))


def _report(meter: Meter, query: DimensionQuery) -> list[tuple[Any, ...]]:
    def read(connection: Connection) -> list[tuple[Any, ...]]:
        rows = [tuple(row) for row in connection.execute(usage_by_statement(query))]
        assert connection.execute(count_of(usage_by_statement(query))).scalar_one() == len(rows)
        return rows

    return meter.database.run(read)


def _key(value: str, hour: int = 0, limit: str = "calls", subject: str = "org") -> RollupKey:
    return (subject, limit, "route", hour * HOUR, value)


def test_deltas_add_up_per_limit_and_value_largest_first(meter: Meter) -> None:
    _record(meter, {_key("/a"): (3, 1), _key("/b"): (5, 2), _key("/a", hour=1): (4, 1)})
    _record(meter, {_key("/a"): (2, 1), _key("/c", limit="api"): (1, 1)})
    query = DimensionQuery("org", "route", ["calls", "api"])
    assert _report(meter, query) == [
        ("calls", "/a", 9, 3),
        ("calls", "/b", 5, 2),
        ("api", "/c", 1, 1),
    ]


def test_the_report_takes_one_subject_dimension_limits_and_hours(meter: Meter) -> None:
    _record(
        meter,
        {
            _key("/a", hour=0): (1, 1),
            _key("/a", hour=1): (10, 1),
            _key("/a", hour=2): (100, 1),
            _key("/a", subject="other"): (7, 1),
            ("org", "calls", "region", 0, "eu"): (5, 1),
            _key("/a", limit="api"): (9, 1),
        },
    )
    assert _report(meter, DimensionQuery("org", "route", ["calls"])) == [("calls", "/a", 111, 3)]
    hours = DimensionQuery("org", "route", ["calls"], since_us=HOUR, until_us=2 * HOUR)
    assert _report(meter, hours) == [("calls", "/a", 10, 1)]
    assert _report(meter, DimensionQuery("org", "route", [])) == []


def test_a_group_all_taken_back_is_left_out(meter: Meter) -> None:
    _record(meter, {_key("/a"): (3, 1), _key("/b"): (2, 1)})
    _record(meter, {_key("/a"): (-3, -1), _key("/b"): (-2, 0)})
    assert _report(meter, DimensionQuery("org", "route", ["calls"])) == [("calls", "/b", 0, 1)]


def test_no_deltas_write_nothing(meter: Meter) -> None:
    _record(meter, {})
    assert _report(meter, DimensionQuery("org", "route", ["calls"])) == []


def _rows(meter: Meter, table: Table) -> list[tuple[Any, ...]]:
    return meter.database.run(
        lambda connection: sorted(tuple(row) for row in connection.execute(select(table)))
    )


def test_a_batch_appends_its_rollups_and_compacting_changes_no_sum(db_url: str) -> None:
    """A batch inserts its rollups into the deltas, where the report finds
    them; `compact_rollups` folds them into the rollups; a void after it
    takes its event back out."""
    at = datetime(2026, 11, 30, 12, 30, tzinfo=UTC)
    hour = hour_start_us(int(at.timestamp()) * 1_000_000)
    routed = [(1, "/a"), (2, "/a"), (3, "/b")]
    with Meter(db_url, clock=FrozenClock(at)) as meter:
        meter.set_limit(Limit("calls", maximum=100, period="1h", dimensions=("route",)))
        meter.apply(
            [
                make_event([("org", "calls", cost)], at, f"e-{i}", {"route": route})
                for i, (cost, route) in enumerate(routed)
            ]
        )
        query = DimensionQuery("org", "route", ["calls"])
        summed = [("calls", "/a", 3, 2), ("calls", "/b", 3, 1)]
        assert _report(meter, query) == summed
        assert _rows(meter, usage_rollups) == []
        assert _rows(meter, usage_rollup_deltas) == [
            ("org", "calls", "route", hour, "/a", 3, 2),
            ("org", "calls", "route", hour, "/b", 3, 1),
        ]
        meter.database.run(compact_rollups)
        assert _report(meter, query) == summed
        assert _rows(meter, usage_rollup_deltas) == []
        assert _rows(meter, usage_rollups) == [
            ("org", "calls", "route", hour, "/a", 3, 2),
            ("org", "calls", "route", hour, "/b", 3, 1),
        ]
        meter.apply([make_event([("org", "calls", 4)], at, "e-3", {"route": "/b"})])
        meter.void("e-1", "recorded twice")
        assert _report(meter, query) == [("calls", "/b", 7, 2), ("calls", "/a", 1, 1)]
        meter.database.run(compact_rollups)
        assert _report(meter, query) == [("calls", "/b", 7, 2), ("calls", "/a", 1, 1)]
        assert _rows(meter, usage_rollup_deltas) == []
        assert len(_rows(meter, usage_rollups)) == 2


RACE_AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RACE_ROUTES = ("/a", "/b", "/c")
WRITERS, BATCHES, BATCH = 2, 24, 4
# A calendar window: the hot path's, whose batches append their rollups.
RACE_LIMIT = Limit("calls", maximum=300, period="1d", window="calendar", dimensions=("route",))


def _write_batches(
    url: str, writer: int, start: threading.Barrier, folded: threading.Event
) -> None:
    with Meter(url, clock=FrozenClock(RACE_AT)) as meter:
        start.wait(30)
        for b in range(BATCHES):
            if b == BATCHES // 2:  # halfway, until a compaction folded some in
                folded.wait(30)
            batch = []
            for n in range(BATCH):
                route = RACE_ROUTES[(b + n + writer) % len(RACE_ROUTES)]
                at = RACE_AT - timedelta(minutes=(b * BATCH + n) * 13 % 110)  # two hours
                charges = [("org", "calls", 1 + n % 3)]
                batch.append(make_event(charges, at, f"w{writer}-{b}-{n}", {"route": route}))
            meter.apply(batch)


def _folded_sums(meter: Meter) -> dict[str, tuple[int, int]]:
    """Per route, the rollups summed as their readers sum them (both tables)."""
    rollups = ROLLUPS.c
    query = select(rollups.value, func.sum(rollups.used), func.sum(rollups.events)).group_by(
        rollups.value
    )
    rows = meter.database.run(lambda connection: list(connection.execute(query)))
    return {value: (int(used), int(events)) for value, used, events in rows}


def _allowed_sums(meter: Meter) -> dict[str, tuple[int, int]]:
    """Per route, the cost and count of the events the results say were allowed."""
    used: Counter[str] = Counter()
    events: Counter[str] = Counter()
    rows = meter.database.run(lambda connection: list(connection.execute(select(results))))
    for row in rows:
        record = record_from_row(tuple(row))
        if record.outcome == "allowed":
            route = (record.metadata or {})["route"]
            used[route] += sum(charge[2] for charge in record.charges)
            events[route] += 1
    return {route: (used[route], events[route]) for route in events}


def test_compaction_racing_two_writers_counts_each_allowed_event_once(db_url: str) -> None:
    """Two writers apply batches while a third folds the deltas in over and
    over: the rollups, folded and appended, equal the allowed results (a
    hard limit denies the last of them), before and after a last compaction."""
    with Meter(db_url, clock=FrozenClock(RACE_AT)) as meter:
        meter.set_limit(RACE_LIMIT)
        start = threading.Barrier(WRITERS + 1)
        folded = threading.Event()
        failures: list[BaseException] = []

        def guarded(work: Any, *args: Any) -> None:
            try:
                work(*args)
            except BaseException as exc:
                failures.append(exc)
                start.abort()

        writers = [
            threading.Thread(target=guarded, args=(_write_batches, db_url, n, start, folded))
            for n in range(WRITERS)
        ]
        for writer in writers:
            writer.start()
        start.wait(30)
        while any(writer.is_alive() for writer in writers):
            if meter.database.run(compact_rollups):
                folded.set()
        for writer in writers:
            writer.join(60)
        assert failures == []
        assert meter.count_results() == WRITERS * BATCHES * BATCH
        assert 0 < meter.outcome_counts()["denied"] < WRITERS * BATCHES * BATCH // 2
        assert folded.is_set()  # it folded in while both writers were halfway
        allowed = _allowed_sums(meter)
        assert sorted(allowed) == sorted(RACE_ROUTES)
        assert _folded_sums(meter) == allowed
        meter.database.run(compact_rollups)
        assert _rows(meter, usage_rollup_deltas) == []
        assert _folded_sums(meter) == allowed
