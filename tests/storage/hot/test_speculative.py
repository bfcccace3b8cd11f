"""`RowCache` and the speculative store's checks, on PostgreSQL.

The rows a committed read and write leave are cached; a speculative read
builds its snapshot from them (a key not cached: no version, a seat value
not cached: no row); its write writes only while the locked rows still
hold the cached values, else the whole transaction aborts. What it means
for decisions is in ``tests/engine/test_speculation.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.errors import StorageError
from metering.storage.hot import Changes, ReadRequest, WantedKey
from metering.storage.hot.direct_postgres import DirectPostgres
from metering.storage.hot.postgres import PostgresHotStore
from metering.storage.hot.speculative import (
    PROBE,
    LearningStore,
    RowCache,
    SpeculativeStore,
)
from metering.storage.tables import counters

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url, clock=FrozenClock(NOW), group_commit=False) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h", window="calendar"))
        meter.consume("s", "calls")
        yield meter


def stored_used(meter: Meter) -> int:
    with meter.sql_engine.connect() as connection:
        return int(connection.execute(select(counters.c.used)).scalar_one())


def wanted(meter: Meter) -> list[WantedKey]:
    with meter.sql_engine.connect() as connection:
        row = connection.execute(select(counters.c.window_start_us, counters.c.window_end_us))
        start, end = row.one()
    return [("calls", "s", start, end)]


def learn(direct: DirectPostgres, cache: RowCache, keys: list[WantedKey]) -> int:
    """Read ``keys`` and write nothing, committed: the rows cached; the version read."""

    def work(store: PostgresHotStore, retry: bool) -> int:
        learning = LearningStore(store.raw, cache)
        version = learning.read(ReadRequest(None, [], keys)).version
        learning.write(Changes(), 0, commit=True)
        return version

    return direct.run(work)


def speculate(direct: DirectPostgres, cache: RowCache, keys: list[WantedKey], version: int) -> int:
    """One more ``used`` on the cached counter, written speculatively; the ``used`` it wrote."""

    def work(store: PostgresHotStore, retry: bool) -> int:
        speculative = SpeculativeStore(store.raw, cache, version)
        snapshot = speculative.read(ReadRequest(None, [], keys))
        assert snapshot.version == version
        [(key, state)] = snapshot.states.items()
        state[0] += 1
        speculative.write(Changes(updated=[(key, state)]), 0, commit=True)
        return int(state[0])

    return direct.run(work, attempts=1)


@pytest.fixture
def direct(meter: Meter) -> Iterator[DirectPostgres]:
    found = DirectPostgres.for_engine(meter.sql_engine)
    assert found is not None
    yield found
    found.close()


def test_a_speculative_write_on_the_cached_rows_commits(
    meter: Meter, direct: DirectPostgres
) -> None:
    cache, keys = RowCache(), wanted(meter)
    version = learn(direct, cache, keys)
    assert speculate(direct, cache, keys, version) == 2
    assert speculate(direct, cache, keys, version) == 3  # the write is cached too
    assert stored_used(meter) == 3


def test_a_speculative_write_on_changed_rows_writes_nothing(
    meter: Meter, direct: DirectPostgres
) -> None:
    cache, keys = RowCache(), wanted(meter)
    version = learn(direct, cache, keys)
    meter.consume("s", "calls")  # another writer: used 2
    with pytest.raises(StorageError, match="the rows changed since they were cached"):
        speculate(direct, cache, keys, version)
    assert stored_used(meter) == 2
    meter.set_limit(Limit("calls", maximum=6, period="1h", window="calendar"))  # a new version
    learn(direct, cache, keys)
    with pytest.raises(StorageError, match="the rows changed since they were cached"):
        speculate(direct, cache, keys, version)
    assert stored_used(meter) == 2


def test_what_is_not_cached_is_not_speculated_on(meter: Meter) -> None:
    cache, keys = RowCache(), wanted(meter)
    seat = ("calls", "s", keys[0][2], "u1")
    assert cache.rows(ReadRequest(None, [], keys), 7) is None
    cache.counters[("calls", "s", keys[0][2])] = None  # known: no row
    found = cache.rows(ReadRequest(None, [], keys, seats=[seat]), 7)
    assert found is not None and found.version == 7
    assert (list(found.counters), list(found.seats)) == ([], [])  # a seat value not cached: none
    assert cache.rows(ReadRequest(None, [("calls", "s")], keys), 7) is None  # its window is not
    cache.forget(ReadRequest(None, [], keys, seats=[seat]))
    assert cache.counters == {}


def test_below_even_odds_only_a_probe_speculates() -> None:
    cache = RowCache()
    assert cache.worth_trying()
    for _ in range(2):  # 0.7 ** 2 < 0.5
        cache.paid(False)
    tried = [cache.worth_trying() for _ in range(2 * PROBE)]
    assert tried.count(True) == 2
    for _ in range(7):
        cache.paid(True)
    assert cache.worth_trying()
