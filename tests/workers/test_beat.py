"""Beat's scheduler (`workers/beat.py`): Celery's `PersistentScheduler` that also
writes beat's heartbeat, named ``beat.PID@HOST``, at most every interval."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from pathlib import Path

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
