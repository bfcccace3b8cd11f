"""Producer, message decoding and batch application (the embedded broker's
sweep is in tests/storage/test_broker.py).

The embedded broker (kombu's SQLAlchemy transport on a SQLite file) is a real
broker that needs no server; broker outages use the session's Redis.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from servers import RedisServer

from metering import FrozenClock, Limit, Meter, make_event
from metering.errors import BrokerUnavailable, InvalidInput, UnknownLimit
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import decode_records, encode_batch, encode_event
from metering.pipeline.producer import UsageProducer, queue_for

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


def sent(path: Path) -> bool:
    """Whether the broker file holds a message yet (kombu creates its table lazily)."""
    try:
        return bool(broker_messages(path))
    except sqlite3.OperationalError:
        return False


@pytest.fixture
def broker(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "broker.db"
    return f"sqla+sqlite:///{path}", path


def test_bad_input_raises_at_emit_and_queues_nothing(broker: tuple[str, Path]) -> None:
    url, _ = broker
    producer = UsageProducer(url, batch_size=10, flush_interval_seconds=60)
    for call in (
        lambda: producer.emit("", "calls"),
        lambda: producer.emit("s", "Not A Name"),
        lambda: producer.emit("s", "calls", cost=-1),
        lambda: producer.emit("s", "calls", event_id="bad id"),
        lambda: producer.emit("s", "calls", occurred_at=datetime(2026, 1, 1)),
        lambda: producer.emit("s", "calls", occurred_at=datetime.now(UTC) + timedelta(hours=1)),
    ):
        with pytest.raises(InvalidInput):
            call()
    assert producer.pending == 0
    producer.close()


def test_batches_are_bounded_by_size_and_flushed_on_demand(broker: tuple[str, Path]) -> None:
    url, path = broker
    producer = UsageProducer(url, batch_size=50, flush_interval_seconds=60)
    ids = [producer.emit(f"s{n}", "calls", cost=2) for n in range(120)]
    assert producer.pending == 20
    assert [len(p["events"]) for _, _, p in broker_messages(path)] == [50, 50]  # type: ignore[arg-type]
    producer.flush()
    payloads = [p for _, _, p in broker_messages(path)]
    assert [len(p["events"]) for p in payloads] == [50, 50, 20]  # type: ignore[arg-type]
    sent = [e["id"] for p in payloads for e in p["events"]]  # type: ignore[attr-defined]
    assert sent == ids
    producer.close()


def test_a_partial_batch_is_sent_after_the_flush_interval(broker: tuple[str, Path]) -> None:
    url, path = broker
    producer = UsageProducer(url, batch_size=1000, flush_interval_seconds=0.05)
    producer.emit("s", "calls")
    deadline = time.monotonic() + 10
    while not sent(path):
        assert time.monotonic() < deadline, "the time bound never sent the batch"
        time.sleep(0.02)
    assert producer.pending == 0
    producer.close()


def test_broker_down_raises_and_keeps_the_events(redis_server: RedisServer, redis_url: str) -> None:
    producer = UsageProducer(
        redis_url,
        batch_size=100,
        flush_interval_seconds=60,
        retry_attempts=2,
        retry_backoff_seconds=0.01,
    )
    redis_server.stop()
    try:
        ids = [producer.emit("s", "calls") for _ in range(3)]
        with pytest.raises(BrokerUnavailable) as raised:
            producer.flush()
        assert raised.value.pending == 3 and producer.pending == 3
    finally:
        redis_server.start()
    producer.flush()
    assert producer.pending == 0
    with redis_server.client() as client:
        assert client.llen("metering") == 1
    producer.close()
    assert len(ids) == 3


def queued_ids(server: RedisServer, queue: str = "metering") -> list[str]:
    """Event ids of every message waiting on a Redis queue."""
    found = []
    with server.client() as client:
        entries = client.lrange(queue, 0, -1)
    for entry in reversed(entries):  # LPUSH: the oldest is last
        assert isinstance(entry, bytes)
        body = json.loads(base64.b64decode(json.loads(entry)["body"]))
        found += [event["id"] for event in body[0][0]["events"]]
    return found


def test_an_event_the_broker_refuses_is_named_in_the_error_and_sent_later(
    redis_server: RedisServer, redis_url: str
) -> None:
    """The contract: the exception names every id that is kept and will be
    sent; the caller must not emit those again under new ids."""
    producer = UsageProducer(
        redis_url,
        batch_size=1,
        flush_interval_seconds=0.05,
        retry_attempts=2,
        retry_backoff_seconds=0.01,
    )
    redis_server.stop()
    try:
        with pytest.raises(BrokerUnavailable) as raised:
            producer.emit("s", "calls", event_id="kept-1")
        assert raised.value.kept == ("kept-1",) and raised.value.accepted
        assert "kept-1" in str(raised.value) and "flush()" not in str(raised.value)
    finally:
        redis_server.start()
    # Sent by the producer's own thread once the broker is back, before close().
    deadline = time.monotonic() + 20
    while producer.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert producer.pending == 0
    assert queued_ids(redis_server) == ["kept-1"]
    producer.close()
    assert queued_ids(redis_server) == ["kept-1"]


def test_an_event_refused_for_a_full_buffer_is_not_kept(
    redis_server: RedisServer, redis_url: str
) -> None:
    producer = UsageProducer(
        redis_url, batch_size=10, flush_interval_seconds=60, retry_attempts=1, max_buffer=2
    )
    redis_server.stop()
    try:
        producer.emit("s", "calls", event_id="in-1")
        producer.emit("s", "calls", event_id="in-2")
        with pytest.raises(BrokerUnavailable) as raised:
            producer.emit("s", "calls", event_id="out-3")
        assert not raised.value.accepted and raised.value.event_id == "out-3"
        assert raised.value.kept == ("in-1", "in-2")
    finally:
        redis_server.start()
    producer.close()
    assert queued_ids(redis_server) == ["in-1", "in-2"]


def test_discard_drops_the_buffer_and_names_what_it_dropped(
    redis_server: RedisServer, redis_url: str
) -> None:
    producer = UsageProducer(redis_url, batch_size=10, flush_interval_seconds=60)
    producer.emit("s", "calls", event_id="d-1")
    assert producer.discard() == ["d-1"]
    producer.close()
    assert queued_ids(redis_server) == []


def test_routing_keeps_a_subject_on_one_queue() -> None:
    assert queue_for("org-42", 1) == "metering"
    chosen = {queue_for(f"org-{n}", 4) for n in range(200)}
    assert chosen == {"metering.0", "metering.1", "metering.2", "metering.3"}
    assert all(queue_for("org-42", 4) == queue_for("org-42", 4) for _ in range(10))


def test_decoding_keeps_what_cannot_become_an_event() -> None:
    good = encode_event(make_event([("s", "calls", 1)], NOW, "good-1"))
    # A cost of 0 decodes (a gauge's level); the worker judges it against its limit.
    bad_cost = {**good, "id": "bad-1", "charges": [["s", "calls", -1]]}
    no_time = {"id": "bad-2", "charges": [["s", "calls", 1]]}
    events, rejected = decode_records(encode_batch([good, bad_cost, no_time, "junk"]))
    assert [e.event_id for e in events] == ["good-1"]
    assert [r.event_id for r in rejected] == ["bad-1", "bad-2", None]
    assert "cost" in rejected[0].reason
    for garbage in ({"nope": 1}, [1, 2], None, {"v": 1, "events": "x"}):
        events, rejected = decode_records(garbage)
        assert events == [] and len(rejected) == 1


def test_applying_a_message_again_changes_nothing(sqlite_url: str) -> None:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        events = [encode_event(make_event([("s", "calls", 3)], NOW, f"e{n}")) for n in range(4)]
        payload = encode_batch([*events, {"id": "broken", "charges": "x", "at": 0}])
        first = apply_batch(meter, payload)
        again = apply_batch(meter, json.loads(json.dumps(payload)))
        assert first.to_dict() == {
            "applied": 4,
            "duplicates": 0,
            "conflicts": 0,
            "rejected": 0,
            "malformed": 1,
        }
        assert (again.applied, again.duplicates) == (0, 4)
        assert [c.used for c in meter.counters("s")] == [9]
        assert meter.outcome_counts() == {"allowed": 3, "denied": 1}
        assert len(meter.rejected_messages()) == 1  # recorded once, not per delivery
        conflict = encode_event(make_event([("s", "calls", 1)], NOW, "e0"))
        assert apply_batch(meter, encode_batch([conflict])).conflicts == 1
        assert [c.used for c in meter.counters("s")] == [9]
        assert any(r[0] == "e0" for r in meter.rejected_messages())


def test_cli_emit_with_the_broker_down_says_so_in_one_line_and_sends_nothing_later(
    redis_server: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    redis_server.stop()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "metering", "emit", "s", "calls", "--event-id", "cli-1"],
            env={**os.environ, "METERING_BROKER_URL": redis_url},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        redis_server.start()
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: the event was not queued: broker unavailable at redis://")
    assert queued_ids(redis_server) == []


# -- charges to undefined limits ------------------------------------------------


def test_a_producer_with_a_database_refuses_an_unknown_limit(
    broker: tuple[str, Path], sqlite_url: str
) -> None:
    url, path = broker
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("api_calls", maximum=10, period="1h"))
        producer = UsageProducer(url, database_url=meter.url, flush_interval_seconds=60)
        assert producer.emit("org-42", "api_calls")  # the names are read
        with pytest.raises(UnknownLimit) as raised:
            producer.emit("org-42", "api_cals")
        assert raised.value.limit == "api_cals"
        with pytest.raises(UnknownLimit):
            producer.emit(charges=[("org-42", "api_calls", 1), ("org-42", "api_cals", 1)])
        # Defined a moment ago (the names were read before): a miss reads them again.
        with Meter(meter.url) as other:
            other.set_limit(Limit("api_cals", maximum=10, period="1h"))
        producer.emit("org-42", "api_cals")
        producer.close()
    assert [len(p["events"]) for _, _, p in broker_messages(path)] == [2]  # type: ignore[arg-type]


def test_the_embedded_default_checks_its_default_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_DATABASE_URL", raising=False)
    monkeypatch.delenv("METERING_BROKER_URL", raising=False)
    with Meter() as meter:  # ./metering.db
        meter.set_limit(Limit("api_calls", maximum=10, period="1h"))
    producer = UsageProducer(flush_interval_seconds=60)
    with pytest.raises(UnknownLimit):
        producer.emit("org-42", "api_cals")
    assert producer.pending == 0
    producer.discard()
    producer.close()


def test_a_producer_that_cannot_see_the_limits_still_queues(
    broker: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker only (no database given or configured), a database file that
    does not exist, or a server that does not answer: the workers decide, as
    they always did."""
    url, path = broker
    monkeypatch.delenv("METERING_DATABASE_URL", raising=False)
    missing = f"sqlite:///{tmp_path}/none.db"
    away = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1
    for database in (None, missing, away):
        producer = UsageProducer(url, database_url=database)
        producer.emit("org-42", "api_cals")
        producer.close()
    assert [len(p["events"]) for _, _, p in broker_messages(path)] == [1, 1, 1]  # type: ignore[arg-type]
    assert not (tmp_path / "none.db").exists()
