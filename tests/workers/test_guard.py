"""Nothing that arrives on a queue vanishes (`workers/guard.py`), without a
broker: what cannot be run is kept in the dead-letter record with its reason
and its raw text (bytes decoded, cut to 64 KiB); while the database is away
the worker tries a few times, then logs the entry whole; keeping it never
raises. Celery's consumer keeps what it would drop. (The Redis channel on a
real Redis: test_guard_redis.py.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery.worker.consumer import Consumer

import workers.guard
import workers.tasks
from metering import Meter
from metering.errors import StorageError
from workers.guard import STORE_ATTEMPTS, GuardedConsumer, dead_letter


@pytest.fixture
def meter(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Meter]:
    with Meter(sqlite_url) as meter:
        monkeypatch.setattr(workers.tasks, "_meter", meter)
        yield meter


def test_a_dead_letter_keeps_its_reason_and_raw_text(meter: Meter) -> None:
    dead_letter("a queue entry must be a JSON object, got list", b"[1, \xff]")
    dead_letter("too long", "x" * 100_000)
    long, first = meter.rejected_messages()
    assert (first.event_id, first.reason) == (None, "a queue entry must be a JSON object, got list")
    assert first.raw == "[1, \\xff]"
    assert long.raw == "x" * 65_536


def test_while_the_database_is_away_the_entry_is_logged_whole(
    meter: Meter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []

    def away(*_args: object, **_kwargs: object) -> None:
        attempts.append(1)
        raise StorageError("database unavailable")

    monkeypatch.setattr(meter, "apply_records", away)
    monkeypatch.setattr(workers.guard.time, "sleep", lambda _seconds: None)  # no backoff here
    with caplog.at_level(logging.ERROR, logger="workers.guard"):
        dead_letter("no such task", "the raw entry")
    assert len(attempts) == STORE_ATTEMPTS
    [record] = caplog.records
    assert record.levelno == logging.CRITICAL
    assert "no such task" in record.getMessage() and "the raw entry" in record.getMessage()


def test_keeping_a_dead_letter_never_raises(
    meter: Meter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(meter, "apply_records", broken)
    with caplog.at_level(logging.ERROR, logger="workers.guard"):
        dead_letter("why", "raw")
    assert "could not keep a dead letter: why" in caplog.text


def test_a_message_celery_would_drop_is_kept_first(
    meter: Meter, monkeypatch: pytest.MonkeyPatch
) -> None:
    handled: list[str] = []
    for hook in ("on_decode_error", "on_unknown_task"):
        monkeypatch.setattr(
            Consumer, hook, lambda *_args, hook=hook: handled.append(hook), raising=True
        )
    message = SimpleNamespace(
        body=b"\x80 not json",
        headers={"task": "nope"},
        content_type="application/x-python-serialize",
        content_encoding="binary",
        delivery_info={"routing_key": "metering"},
    )
    consumer = GuardedConsumer.__new__(GuardedConsumer)  # only its hooks are called
    consumer.on_decode_error(message, ValueError("bad"))
    consumer.on_unknown_task({}, message, KeyError("nope"))
    assert handled == ["on_decode_error", "on_unknown_task"]  # then Celery's own handling
    unknown, undecodable = meter.rejected_messages()
    assert undecodable.reason == "message body cannot be decoded: ValueError('bad')"
    assert unknown.reason == "no such task: KeyError('nope')"
    assert '"content_type": "application/x-python-serialize"' in unknown.raw
    assert '"body": "\\\\x80 not json"' in unknown.raw
