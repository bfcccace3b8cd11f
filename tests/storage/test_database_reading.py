"""`Database.reading`: a connection that only reads. On SQLite its transaction
is a deferred one (a WAL snapshot): a writer is not held up by a long reader
(a report streamed to a slow client), and the reader keeps its snapshot."""

from __future__ import annotations

import sqlite3
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


def test_the_read_sides_answers_wait_for_no_writer(tmp_path: Any) -> None:
    """`Database.read`: counters, results and the seats held are read
    while another connection holds SQLite's write lock (a transaction left
    open in a script), from what was committed before it."""
    url = f"sqlite:///{tmp_path / 'held.db'}"
    with Meter(url) as meter:
        meter.set_limit(Limit("calls", 10, "1h"))
        meter.set_limit(Limit("seats", 5, "1h", distinct="user"))
        meter.consume("org", "calls", event_id="e1")
        meter.consume("org", "seats", event_id="e2", metadata={"user": "ada"})
        holder = sqlite3.connect(tmp_path / "held.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("UPDATE limits SET maximum = maximum")
        answers: list[object] = []

        def read() -> None:
            answers.append(meter.count_results())
            answers.append(meter.result("e1") is not None)
            answers.append(meter.decided(["e1", "e9"]))
            answers.append([c.used for c in meter.counters("org", "calls")])
            answers.append(meter.seats("org", "seats"))

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(20)  # before, each waited out the lock: 60 s, ten times
        waited = reader.is_alive()
        holder.rollback()
        reader.join()
        assert not waited
        assert answers == [2, True, {"e1"}, [1], ["ada"]]
