"""What the query classes share (`storage/on_connection.py`), on SQLite and
PostgreSQL: rows in chunks, an upsert that changes the columns asked, and
amounts added to rows, taken back never below a floor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import select

from metering import Meter
from metering.storage.on_connection import CHUNK, PG_BULK_ROWS, OnConnection, chunks
from metering.storage.tables import usage_rollups

T = TypeVar("T")
KEY = ["subject", "limit_name", "dimension", "hour_start_us", "value"]


class Rollups(OnConnection):
    """The shared statements on a table whose rows hold amounts."""

    def upsert(self, values: dict[str, Any], changed: list[str] | None = None) -> None:
        self._upsert(usage_rollups, values, key=KEY, changed=changed)

    def add(self, rows: list[dict[str, Any]], floor: int | None = None) -> None:
        self._add_amounts(usage_rollups, KEY, "used", rows, floor=floor)

    def bulk(self, rows: int) -> bool:
        return self._bulk(rows)

    def rows(self) -> list[tuple[str, int, int]]:
        query = select(usage_rollups.c.value, usage_rollups.c.used, usage_rollups.c.events)
        return [tuple(row) for row in self.connection.execute(query.order_by("value"))]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _on(meter: Meter, work: Callable[[Rollups], T]) -> T:
    return meter.database.run(lambda connection: work(Rollups(connection)))


def _row(value: str, used: int, events: int = 1) -> dict[str, Any]:
    return {
        "subject": "org",
        "limit_name": "calls",
        "dimension": "route",
        "hour_start_us": 0,
        "value": value,
        "used": used,
        "events": events,
    }


def test_chunks_cut_a_sequence_in_order() -> None:
    assert list(chunks([1, 2, 3, 4, 5], 2)) == [[1, 2], [3, 4], [5]]
    assert list(chunks([], 2)) == []
    assert [len(part) for part in chunks(list(range(CHUNK + 1)))] == [CHUNK, 1]


def test_only_postgresql_takes_the_bulk_form_from_its_row_count(meter: Meter) -> None:
    postgres = meter.sql_engine.dialect.name == "postgresql"
    assert _on(meter, lambda store: store.bulk(PG_BULK_ROWS)) is postgres
    assert _on(meter, lambda store: store.bulk(PG_BULK_ROWS - 1)) is False


def test_an_upsert_inserts_then_changes_the_columns_asked(meter: Meter) -> None:
    _on(meter, lambda store: store.upsert(_row("/a", 5, 1)))
    _on(meter, lambda store: store.upsert(_row("/a", 9, 2), changed=["events"]))
    assert _on(meter, lambda store: store.rows()) == [("/a", 5, 2)]
    _on(meter, lambda store: store.upsert(_row("/a", 7, 3)))
    assert _on(meter, lambda store: store.rows()) == [("/a", 7, 3)]


def test_amounts_add_up_and_a_new_key_makes_a_row(meter: Meter) -> None:
    _on(meter, lambda store: store.add([_row("/a", 5), _row("/b", 2)]))
    _on(meter, lambda store: store.add([_row("/a", 3)]))
    assert _on(meter, lambda store: store.rows()) == [("/a", 8, 1), ("/b", 2, 1)]


def test_an_amount_taken_back_changes_only_a_row_that_is_there(meter: Meter) -> None:
    _on(meter, lambda store: store.add([_row("/a", 5)]))
    _on(meter, lambda store: store.add([_row("/a", -2), _row("/missing", -4)]))
    assert _on(meter, lambda store: store.rows()) == [("/a", 3, 1)]


def test_an_amount_taken_back_stops_at_the_floor(meter: Meter) -> None:
    _on(meter, lambda store: store.add([_row("/a", 5), _row("/b", 5)]))
    _on(meter, lambda store: store.add([_row("/a", -9)], floor=0))
    _on(meter, lambda store: store.add([_row("/b", -9)]))
    assert _on(meter, lambda store: store.rows()) == [("/a", 0, 1), ("/b", -4, 1)]


def test_many_rows_go_in_chunks(meter: Meter) -> None:
    rows = [_row(f"/{i:04}", 1) for i in range(CHUNK + 3)]
    _on(meter, lambda store: store.add(rows))
    assert len(_on(meter, lambda store: store.rows())) == CHUNK + 3
