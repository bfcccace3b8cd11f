"""`Database.reading`: a connection that only reads. On SQLite its transaction
is a deferred one (a WAL snapshot): a writer is not held up by a long reader
(a report streamed to a slow client), and the reader keeps its snapshot."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from metering import Limit, Meter


def test_a_long_reader_holds_up_no_writer(db_url: str) -> None:
    with Meter(db_url) as meter:
        meter.set_limit(Limit("a", 1, "1h"))

        def names() -> Iterator[Any]:
            with meter.database.reading() as connection:
                yield from connection.exec_driver_sql("SELECT name FROM limits ORDER BY name")

        reader = iter(names())
        assert next(reader) == ("a",)  # its transaction is open now
        writer = threading.Thread(target=meter.set_limit, args=(Limit("b", 1, "1h"),))
        writer.start()
        writer.join(10)
        assert not writer.is_alive()
        assert list(reader) == []  # its snapshot: b came later
        assert [limit.name for limit in meter.list_limits()] == ["a", "b"]
