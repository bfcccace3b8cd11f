"""Liveness in the database (`storage/health.py`): what a probe reads without
creating anything, and heartbeats, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import to_us
from metering.errors import ConfigurationError
from metering.storage.health import (
    BEAT,
    FORGET_AFTER_US,
    WORKER,
    ConnectionCounts,
    DatabaseProbe,
    SchemaState,
    engine_options,
    forget_heartbeat,
    record_heartbeat,
    sqlite_file,
)
from metering.storage.schema_revision import SCHEMA_REVISION

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_a_sqlite_url_names_its_file() -> None:
    assert sqlite_file("sqlite:////tmp/a/metering.db") == Path("/tmp/a/metering.db")
    assert sqlite_file("sqlite://") is None
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql://h/db") is None
    assert sqlite_file("not a url") is None


def test_only_postgresql_bounds_its_connect_time_in_whole_seconds_from_two() -> None:
    assert engine_options("sqlite:///x.db", 5) == {}
    assert engine_options("postgresql://h/db", 0.1) == {"connect_args": {"connect_timeout": 2}}
    assert engine_options("postgresql://h/db", 7.4) == {"connect_args": {"connect_timeout": 7}}


def test_room_is_what_the_server_takes_beside_the_superusers_places() -> None:
    assert ConnectionCounts(metering=3, in_use=10, max=100, reserved=3).room == 87


def test_a_sqlite_file_not_made_yet_has_nothing_and_stays_unmade(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    probe = DatabaseProbe(f"sqlite:///{missing}")
    try:
        assert probe.schema() == SchemaState("sqlite", False, None, SCHEMA_REVISION, True)
        assert probe.heartbeats(WORKER) == {}
        assert probe.decided(["e1"]) == set()
        assert probe.limit_names() is None
        assert probe.rejected_since(0) == 0
        assert probe.connections() is None
    finally:
        probe.close()
    assert not missing.exists()
    with pytest.raises(ConfigurationError, match="does not exist"):
        DatabaseProbe(f"sqlite:///{tmp_path}/no/such/dir.db")


def test_a_probe_reads_the_schema_limits_and_results(db_url: str) -> None:
    with Meter(db_url) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1h"))
        meter.consume("org", "calls", event_id="e1")
    probe = DatabaseProbe(db_url)
    try:
        schema = probe.schema()
        assert schema.at_head and schema.known and schema.exists
        assert probe.limit_names() == frozenset({"calls"})
        assert probe.decided(["e1", "e2"]) == {"e1"}
        assert probe.rejected_since(0) == 0
        counts = probe.connections()
        if db_url.startswith("postgresql"):
            assert counts is not None and counts.in_use >= 1 and counts.max > counts.reserved
        else:
            assert counts is None
    finally:
        probe.close()


def test_heartbeats_are_kept_per_role_and_name_and_forgotten(db_url: str) -> None:
    clock = FrozenClock(NOW)
    record_heartbeat(db_url, WORKER, "w1@host", clock)
    record_heartbeat(db_url, BEAT, "beat", clock)
    clock.advance(seconds=10)
    record_heartbeat(db_url, WORKER, "w1@host", clock)
    record_heartbeat(db_url, WORKER, "w2@host", clock)
    probe = DatabaseProbe(db_url)
    try:
        now_us = to_us(clock())
        assert probe.heartbeats(WORKER) == {"w1@host": now_us, "w2@host": now_us}
        assert probe.heartbeats(BEAT) == {"beat": to_us(NOW)}
        forget_heartbeat(db_url, WORKER, "w2@host")
        assert probe.heartbeats(WORKER) == {"w1@host": now_us}
        clock.advance(timedelta(microseconds=FORGET_AFTER_US + 1))
        record_heartbeat(db_url, BEAT, "beat", clock)  # deletes the rows gone this long
        assert probe.heartbeats(WORKER) == {}
        assert probe.heartbeats(BEAT) == {"beat": to_us(clock())}
    finally:
        probe.close()
