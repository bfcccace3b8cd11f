"""Beat's scheduler (`workers/beat.py`): Celery's `PersistentScheduler` that also
writes beat's heartbeat, named ``beat.PID@HOST``, at most every interval, and
says in one line, not a traceback a task, that the broker cannot be reached."""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest
from servers import RedisServer, free_port

from metering import FrozenClock
from metering.settings import Settings
from metering.storage.health import BEAT, DatabaseProbe
from workers.app import create_app
from workers.beat import HeartbeatScheduler, beat_name

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_a_beat_is_named_for_its_process_and_host() -> None:
    assert beat_name() == f"beat.{os.getpid()}@{socket.gethostname()}"


def test_beats_scheduler_writes_its_heartbeat_at_most_every_interval(tmp_path: Path) -> None:
    database, broker = f"sqlite:///{tmp_path}/metering.db", f"sqla+sqlite:///{tmp_path}/broker.db"
    app = create_app(broker, Settings(database_url=database, broker_url=broker))
    clock = FrozenClock(T0)
    scheduler = HeartbeatScheduler(
        app=app, schedule_filename=str(tmp_path / "beat-schedule"), clock=clock
    )
    try:
        wait = scheduler.tick()
        assert 0 < wait <= scheduler.interval_seconds
        clock.advance(seconds=5)
        scheduler.tick()  # too soon: the heartbeat is not written again
        probe = DatabaseProbe(database)
        try:
            [(name, seen_us)] = probe.heartbeats(BEAT).items()
        finally:
            probe.close()
        assert name == f"beat.{os.getpid()}@{socket.gethostname()}"
        assert seen_us == int(T0.timestamp()) * 1_000_000
        scheduler.next_heartbeat = 0.0  # the interval has passed
        scheduler.tick()
        probe = DatabaseProbe(database)
        try:
            assert probe.heartbeats(BEAT)[name] == seen_us + 5_000_000
        finally:
            probe.close()
    finally:
        scheduler.close()
        app.close()


def test_a_broker_out_of_reach_is_one_warning_line_until_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A real Redis on a port of its own, stopped and started again under beat.
    redis = RedisServer(tmp_path / "redis", port=free_port())
    redis.start()
    database, broker = f"sqlite:///{tmp_path}/metering.db", redis.url(0)
    app = create_app(broker, Settings(database_url=database, broker_url=broker))
    app.conf.broker_transport_options = {"max_retries": 0}  # no retries of a publish
    scheduler = HeartbeatScheduler(app=app, schedule_filename=str(tmp_path / "beat-schedule"))
    entries = list(scheduler.schedule.values())
    caplog.set_level(logging.DEBUG, logger="workers.beat")
    try:
        scheduler.apply_entry(entries[0])
        redis.stop()
        for entry in entries * 2:
            scheduler.apply_entry(entry)
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert [line.split(" (")[0] for line in said] == ["beat: the broker cannot be reached"]
        assert not any(r.exc_info for r in caplog.records)  # no traceback
        not_sent = [r for r in caplog.records if "not sent:" in r.getMessage()]
        assert len(not_sent) == 2 * len(entries)  # each, in one debug line
        redis.start()
        scheduler.apply_entry(entries[0])
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert said[1:] == ["beat: the broker is back; due tasks are sent again"]
    finally:
        scheduler.close()
        app.close()
        redis.destroy()
