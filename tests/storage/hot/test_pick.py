"""`hot_store` picks the hot path's store by the connection's database."""

from __future__ import annotations

from metering import Meter
from metering.storage.hot.pick import hot_store
from metering.storage.hot.postgres import PostgresHotStore
from metering.storage.hot.sqlite import SqliteHotStore


def test_each_database_gets_its_own_hot_store(db_url: str) -> None:
    expected = PostgresHotStore if db_url.startswith("postgresql") else SqliteHotStore
    with Meter(db_url) as meter:
        picked = meter.database.run(lambda connection: type(hot_store(connection)))
    assert picked is expected
