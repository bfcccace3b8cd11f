"""The embedded broker (`storage/broker.py`, kombu's SQLAlchemy transport on a
SQLite file): a take counts, a settled message leaves the file; the sweep gives
stale ones back and hands those taken too often to be kept; processes starting
together on a new file all come up; our channel is used even after kombu's own
was loaded."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from metering import FrozenClock
from metering.errors import DatabaseUnavailable
from metering.pipeline.messages import decode_records
from metering.pipeline.producer import UsageProducer, make_celery
from metering.pipeline.routing import APPLY_BATCH_TASK
from metering.storage.broker import sweep_embedded_broker
from metering.storage.kombu_tables import Unfinished, unfinished_of

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def rows(path: Path) -> list[tuple[int, bool, int]]:
    """(id, visible, version) of every message in an embedded broker file."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        found = connection.execute("SELECT id, visible, version FROM kombu_message ORDER BY id")
        return [(message_id, bool(visible), version) for message_id, visible, version in found]


@pytest.fixture
def broker(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "broker.db"
    return f"sqla+sqlite:///{path}", path


def test_a_take_counts_and_a_settled_message_leaves_the_file(broker: tuple[str, Path]) -> None:
    """kombu's channel kept every consumed message, taken, in the file, and gave
    one back as a copy: its takes were not counted and the sweep had to guess
    which were done."""
    url, path = broker
    app = make_celery(url)
    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue("metering")
        for body in ("a", "b", "c"):
            queue.put({"body": body})
        first = queue.get(timeout=5)
        assert rows(path) == [(1, False, 2), (2, True, 1), (3, True, 1)]
        first.requeue()  # the same row, visible again, its take counted
        assert rows(path) == [(1, True, 2), (2, True, 1), (3, True, 1)]
        second = queue.get(timeout=5)
        second.ack()
        third = queue.get(timeout=5)
        third.reject()
        assert (second.payload, third.payload) == ({"body": "b"}, {"body": "c"})
        assert rows(path) == [(1, True, 2)]
        again = queue.get(timeout=5)
        assert again.payload == {"body": "a"}
        assert rows(path) == [(1, False, 3)]
        queue.close()
    # Closed holding it (a warm shutdown): given back.
    assert rows(path) == [(1, True, 3)]


def test_a_message_consumed_without_acknowledgement_leaves_the_file_when_taken(
    broker: tuple[str, Path],
) -> None:
    url, path = broker
    app = make_celery(url)
    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue("metering", no_ack=True)
        queue.put({"body": "a"})
        queue.put({"body": "b"})
        assert queue.get(timeout=5).payload == {"body": "a"}
        assert rows(path) == [(2, True, 1)]
        assert connection.default_channel.basic_get("metering", no_ack=True) is not None
        assert rows(path) == []
        queue.close()


def take(path: Path, taken_at: datetime, versions: dict[int, int]) -> None:
    """Mark messages taken at ``taken_at`` (naive UTC), each at its version."""
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        for message_id, version in versions.items():
            connection.execute(
                "UPDATE kombu_message SET visible = 0, timestamp = ?, version = ? WHERE id = ?",
                (taken_at, version, message_id),
            )


def test_the_sweep_gives_back_stale_messages_and_gives_up_after_the_most_deliveries(
    broker: tuple[str, Path],
) -> None:
    url, path = broker
    with UsageProducer(
        url, batch_size=2, flush_interval_seconds=60, clock=FrozenClock(NOW)
    ) as producer:
        ids = [producer.emit("s", "calls", occurred_at=NOW) for _ in range(4)]
    taken_at = datetime(2026, 11, 22, 11, 0)  # stamped in UTC when a worker takes one
    take(path, taken_at, {1: 2, 2: 4})  # taken once; taken three times
    given_up: list[Unfinished] = []
    at = taken_at.replace(tzinfo=UTC)

    def sweep(after: timedelta) -> dict[str, int]:
        return sweep_embedded_broker(
            url, given_up.extend, now=at + after, visibility_timeout_seconds=300, max_deliveries=3
        )

    assert sweep(timedelta(seconds=299)) == {"restored": 0, "dead_lettered": 0}
    assert sweep(timedelta(seconds=301)) == {"restored": 1, "dead_lettered": 1}
    assert rows(path) == [(1, True, 2)]
    [unfinished] = given_up
    assert (unfinished.deliveries, unfinished.task) == (3, APPLY_BATCH_TASK)
    assert [e.event_id for e in decode_records(unfinished.batch)[0]] == ids[2:]
    assert json.loads(unfinished.raw)["headers"]["task"] == APPLY_BATCH_TASK


def test_the_sweep_deletes_nothing_it_could_not_keep(broker: tuple[str, Path]) -> None:
    url, path = broker
    with UsageProducer(url, flush_interval_seconds=60, clock=FrozenClock(NOW)) as producer:
        producer.emit("s", "calls", occurred_at=NOW)
    take(path, datetime(2026, 11, 22, 11, 0), {1: 6})

    def unavailable(messages: object) -> None:
        raise DatabaseUnavailable("database unavailable: gone")

    with pytest.raises(DatabaseUnavailable):
        sweep_embedded_broker(url, unavailable, now=NOW)
    assert rows(path) == [(1, False, 6)]


@pytest.mark.parametrize(
    ("envelope", "task", "batch"),
    [
        ({"headers": {}, "body": "e30="}, None, None),
        ({"headers": {"task": "metering.prune"}, "body": "W10="}, "metering.prune", None),
        ({"headers": {"task": APPLY_BATCH_TASK}, "body": "not json"}, APPLY_BATCH_TASK, None),
        (
            {"headers": {"task": APPLY_BATCH_TASK}, "body": '[[{"v": 1}], {}, {}]'},
            APPLY_BATCH_TASK,
            {"v": 1},
        ),
        (
            {"headers": {"task": APPLY_BATCH_TASK}, "body": "[[1, 2], {}, {}]"},
            APPLY_BATCH_TASK,
            {"args": [1, 2], "kwargs": {}},
        ),
    ],
)
def test_an_unfinished_message_is_read_as_the_worker_reads_it(
    envelope: dict[str, object], task: str | None, batch: object
) -> None:
    raw = json.dumps(envelope)
    assert unfinished_of(raw, 4) == Unfinished(raw, 4, task, batch)
    assert unfinished_of("[", 4) == Unfinished("[", 4, None, None)


def _declare_at_once(url: str, start: Any, queue: str) -> None:
    app = make_celery(url)
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        start.wait(30)
        channel.queue_declare(queue)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))
def test_processes_starting_together_on_fresh_embedded_files_all_come_up(
    tmp_path: Path, attempt: int
) -> None:
    """Workers and producers started at the same moment on a new broker file
    each create kombu's tables and queue rows; none may die of the race."""
    import multiprocessing

    url = f"sqla+sqlite:///{tmp_path}/broker-{attempt}.db"
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [
        context.Process(target=_declare_at_once, args=(url, start, "metering")) for _ in range(6)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)
    start.set()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    with sqlite3.connect(tmp_path / f"broker-{attempt}.db") as connection:
        names = [row[0] for row in connection.execute("SELECT name FROM kombu_queue")]
    assert names == ["metering"]


def test_the_embedded_transport_is_used_after_kombus_own_was_loaded(tmp_path: Path) -> None:
    """kombu resolves a URL prefix once per process and keeps the class: a
    ``sqla+`` connection made before ours (by the app, another library, an
    earlier test) must not leave later producers on kombu's unsafe channel."""
    script = f"""
from kombu import Connection
with Connection("sqla+sqlite:///{tmp_path}/theirs.db") as connection:
    connection.SimpleQueue("q").put({{"a": 1}})
from metering.pipeline.producer import make_celery
app = make_celery("sqla+sqlite:///{tmp_path}/ours.db")
with app.connection_for_write() as connection:
    print(type(connection.default_channel).__qualname__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "_EmbeddedChannel"
