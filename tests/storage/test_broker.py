"""The embedded broker (`storage/broker.py`, kombu's SQLAlchemy transport on a
SQLite file): the sweep deletes consumed messages and makes stale ones
visible again; processes starting together on a new file all come up; our
channel is used even after kombu's own was loaded."""

from __future__ import annotations

import base64
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
from metering.pipeline.producer import UsageProducer
from metering.storage.broker import event_ids_of, sweep_embedded_broker

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def broker_messages(path: Path) -> list[tuple[int, bool, dict[str, object]]]:
    """(id, visible, batch payload) of every message in an embedded broker file."""
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT id, visible, payload FROM kombu_message ORDER BY id")
        found = []
        for message_id, visible, payload in rows:
            envelope = json.loads(payload)
            body = json.loads(base64.b64decode(envelope["body"]))
            found.append((message_id, bool(visible), body[0][0]))
    return found


@pytest.fixture
def broker(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "broker.db"
    return f"sqla+sqlite:///{path}", path


def test_sweep_deletes_consumed_messages_and_redelivers_stale_ones(
    broker: tuple[str, Path], tmp_path: Path
) -> None:
    url, path = broker
    with UsageProducer(
        url, batch_size=2, flush_interval_seconds=60, clock=FrozenClock(NOW)
    ) as producer:
        ids = [producer.emit("s", "calls", occurred_at=NOW) for _ in range(4)]
    taken_at = datetime(2026, 11, 22, 11, 0)  # stamped in UTC when a worker takes one
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE kombu_message SET visible = 0, timestamp = ?", (taken_at,))
    [(first, _, _), (second, _, _)] = broker_messages(path)
    assert (
        event_ids_of(
            sqlite3.connect(path).execute("SELECT payload FROM kombu_message").fetchone()[0]
        )
        == ids[:2]
    )

    def decided(wanted: object) -> set[str]:
        return set(ids[:2])  # the first message's events have results, the second's do not

    def kept(digests: object) -> set[str]:
        return set()

    fresh = sweep_embedded_broker(
        url, decided, kept, now=taken_at.replace(tzinfo=UTC) + timedelta(seconds=10)
    )
    assert fresh == {"deleted": 1, "restored": 0}  # the second is not stale yet
    stale = sweep_embedded_broker(
        url, decided, kept, now=taken_at.replace(tzinfo=UTC) + timedelta(hours=1)
    )
    assert stale == {"deleted": 0, "restored": 1}
    assert [(m, visible) for m, visible, _ in broker_messages(path)] == [(second, True)]
    assert first != second


def _declare_at_once(url: str, start: Any, queue: str) -> None:
    from metering.pipeline.producer import make_celery

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
