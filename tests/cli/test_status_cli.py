"""`metering status` and `metering result`'s pending, on the embedded default.

SQLite files and the embedded broker (kombu's SQL transport on a file) in the
test's directory: no server. Heartbeats are written with frozen clocks and
read by `collect_status` with another, so ages are exact; the command itself
runs through click's CliRunner. Real workers and Redis:
tests/integration/test_status_live.py.
"""

from __future__ import annotations

import base64
import json
import socket
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from metering import FrozenClock, Limit, Meter
from metering.cli import main
from metering.cli.status import collect_status
from metering.domain.events import make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.producer import UsageProducer, make_celery
from metering.pipeline.routing import APPLY_BATCH_TASK, SENT_AT_HEADER
from metering.storage.health import (
    ALIVE_WITHIN_SECONDS,
    BEAT,
    WORKER,
    DatabaseProbe,
    forget_heartbeat,
    record_heartbeat,
)
from metering.storage.queue_state import is_queued, open_queues, queued_event_ids
from metering.storage.schema_revision import SCHEMA_REVISION

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class Files:
    """A database and an embedded broker in the test's directory. The
    database is absent until used; a test that uses it asks for `sqlite_url`
    too, which puts the migrated template's copy at the same path."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.database = f"sqlite:///{directory}/metering.db"
        self.broker_file = directory / "broker.db"
        self.broker = f"sqla+sqlite:///{self.broker_file}"

    def run(self, *args: str, code: int | None = None) -> Result:
        """``metering --database DB ARGS...``; checks the exit code when told."""
        result = CliRunner().invoke(main, ["--database", self.database, *args])
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    def status(self, *args: str, code: int | None = None) -> Result:
        return self.run("status", "--broker", self.broker, *args, code=code)

    def emit(self, *event_ids: str, clock: FrozenClock | None = None, queues: int = 1) -> None:
        """One message per event, sent at the clock's time."""
        with UsageProducer(self.broker, batch_size=1, queues=queues, clock=clock) as producer:
            for event_id in event_ids:
                producer.emit(f"org-{event_id}", "calls", event_id=event_id)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def reasons(result: Result) -> list[str]:
    """The lines on stderr; each must be one ``unhealthy: CHECK: reason``."""
    lines = result.stderr.splitlines()
    assert all(line.startswith("unhealthy: ") for line in lines), result.stderr
    return lines


def as_json(result: Result) -> dict[str, object]:
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    return document


def check_of(report: dict[str, object], name: str) -> dict[str, object]:
    checks = report["checks"]
    assert isinstance(checks, list)
    [found] = [c for c in checks if c["check"] == name]
    assert isinstance(found, dict)
    return found


# -- the command on a bare machine -------------------------------------------------------


def test_a_fresh_directory_is_unhealthy_only_for_want_of_a_worker(files: Files) -> None:
    result = files.status(code=1)
    assert reasons(result) == ["unhealthy: workers: no heartbeat from a worker ever (by heartbeat)"]
    assert "Traceback" not in result.output
    assert "metering status: UNHEALTHY" in result.stdout
    assert "never seen" in result.stdout  # beat: reported, not required
    # Looking created nothing: no database, no broker file.
    assert sorted(p.name for p in files.directory.iterdir()) == []


def test_require_none_asks_only_for_the_database_and_the_broker(files: Files) -> None:
    result = files.status("--require", "none", "--format", "json", code=0)
    assert result.stderr == ""
    report = as_json(result)
    assert report["healthy"] is True and report["reasons"] == []
    assert report["queues"] == [{"queue": "metering", "waiting": 0, "unacked": 0}]
    assert report["workers"] == {"method": "heartbeat", "alive": []}
    assert check_of(report, "workers")["state"] == "warn"
    assert check_of(report, "beat")["state"] == "warn"


@pytest.mark.parametrize(
    ("database", "says"),
    [
        ("postgresql://nobody@127.0.0.1:1/none", "database unavailable"),
        ("mysql://localhost/x", "unsupported database 'mysql'"),
        ("sqlite:////nonexistent-dir/metering.db", "does not exist"),
    ],
    ids=["unreachable", "unsupported", "missing-directory"],
)
def test_a_database_that_cannot_be_used_is_one_line_and_exit_1(
    files: Files, database: str, says: str
) -> None:
    result = CliRunner().invoke(
        main, ["--database", database, "status", "--broker", files.broker, "--require", "none"]
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    [line] = reasons(result)
    assert line.startswith("unhealthy: database: ") and says in line


@pytest.mark.parametrize(
    ("broker", "says"),
    [
        ("redis://127.0.0.1:1/0", "broker unreachable"),
        ("sqla+sqlite:////nonexistent-dir/broker.db", "does not exist"),
        ("amqp://guest@localhost//", "Redis and the embedded broker only"),
    ],
    ids=["unreachable-redis", "missing-directory", "unsupported"],
)
def test_a_broker_that_cannot_be_read_is_one_line_and_exit_1(
    files: Files, broker: str, says: str
) -> None:
    result = files.run("status", "--broker", broker, "--require", "none", code=1)
    [line] = reasons(result)
    assert line.startswith("unhealthy: broker: ") and says in line
    assert "Traceback" not in result.output


def test_an_unreachable_broker_also_fails_the_required_ping(files: Files) -> None:
    result = files.run("status", "--broker", "redis://127.0.0.1:1/0", "--timeout", "1", code=1)
    assert [line.split(":")[1].strip() for line in reasons(result)] == ["broker", "workers"]
    assert "unhealthy: workers: cannot ping: the broker is unreachable" in reasons(result)


def test_bad_options_are_one_error_line(files: Files) -> None:
    for args in (["--require", "bogus"], ["--require", "none,beat"], ["--max-age", "-1"]):
        result = files.status(*args, code=1)
        assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1


def test_help_documents_the_exit_codes() -> None:
    status = CliRunner().invoke(main, ["status", "--help"]).output
    assert "0  healthy" in status and "1  unhealthy" in status and "--require LIST" in status
    result = CliRunner().invoke(main, ["result", "--help"]).output
    assert "3  pending" in result and "2  denied or rejected" in result


# -- the schema ---------------------------------------------------------------------------


def set_revision(url: str, revision: str) -> None:
    Meter(url).close()
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (revision,))


@pytest.mark.usefixtures("sqlite_url")
def test_the_schema_revision_is_reported_against_the_head(files: Files) -> None:
    Meter(files.database).close()
    report = as_json(files.status("--require", "none", "--format", "json", code=0))
    assert report["database"] == {
        "url": files.database,
        "reachable": True,
        "revision": SCHEMA_REVISION,
        "head": SCHEMA_REVISION,
    }
    assert (
        check_of(report, "database")["detail"] == f"reachable, schema at {SCHEMA_REVISION} (head)"
    )


@pytest.mark.usefixtures("sqlite_url")
def test_an_older_sqlite_schema_is_healthy_since_sqlite_upgrades_itself(files: Files) -> None:
    set_revision(files.database, "0006")
    report = as_json(files.status("--require", "none", "--format", "json", code=0))
    detail = check_of(report, "database")["detail"]
    assert detail == f"schema 0006, head {SCHEMA_REVISION}: SQLite upgrades itself on first use"


@pytest.mark.usefixtures("sqlite_url")
def test_a_schema_this_release_does_not_know_is_unhealthy(files: Files) -> None:
    set_revision(files.database, "9999")
    result = files.status("--require", "none", code=1)
    newer = f"schema 9999 is newer than this release knows (head {SCHEMA_REVISION})"
    assert reasons(result) == [f"unhealthy: database: {newer}"]


# -- queues and the oldest event -------------------------------------------------------


def test_queue_depths_count_waiting_and_taken_messages(files: Files) -> None:
    files.emit("e-1", "e-2", "e-3")
    files.emit("e-4", queues=4)  # hash-routed: on one of metering.0 … metering.3
    with sqlite3.connect(files.broker_file) as connection:  # a worker took the first
        connection.execute("UPDATE kombu_message SET visible = 0 WHERE id = 1")
    report = as_json(files.status("--require", "none", "--format", "json", code=0))
    queues = report["queues"]
    assert isinstance(queues, list)
    assert queues[0] == {"queue": "metering", "waiting": 2, "unacked": 1}
    # The hash-routed queue is found on the broker, though --queues was 1.
    assert len(queues) == 2 and queues[1]["queue"].startswith("metering.")
    assert (queues[1]["waiting"], queues[1]["unacked"]) == (1, 0)
    # --queues 4 reports the other three, empty.
    report = as_json(files.status("--queues", "4", "--require", "none", "--format", "json"))
    assert [q["queue"] for q in report["queues"]] == [
        "metering",
        "metering.0",
        "metering.1",
        "metering.2",
        "metering.3",
    ]


@pytest.mark.usefixtures("sqlite_url")
def test_the_oldest_undecided_event_is_aged_by_the_clock(files: Files) -> None:
    files.emit("old-1", clock=FrozenClock(T0))
    files.emit("new-1", clock=FrozenClock(T0 + timedelta(seconds=50)))
    report = collect_status(
        files.database,
        files.broker,
        clock=FrozenClock(T0 + timedelta(seconds=90)),
        queues=["metering"],
        require=frozenset(),
    )
    assert report.facts["oldest_event"] == {
        "age_seconds": 90.0,
        "sent_at": "2026-11-22T12:00:00.000+00:00",
        "queue": "metering",
        "unacked": False,
        "event_id": "old-1",
    }
    assert report.healthy
    # Once old-1 has a result, new-1 is the oldest undecided.
    with Meter(files.database) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1d"))
        meter.consume("org-old-1", "calls", event_id="old-1")
    report = collect_status(
        files.database,
        files.broker,
        clock=FrozenClock(T0 + timedelta(seconds=90)),
        queues=["metering"],
        require=frozenset(),
        max_age_seconds=30,
    )
    assert report.facts["oldest_event"]["event_id"] == "new-1"
    assert report.facts["oldest_event"]["age_seconds"] == 40.0
    assert report.reasons == [
        "oldest event: 40 s old, sent 2026-11-22 12:00:50 UTC (metering, waiting): over 30 s"
    ]


def test_max_age_fails_the_command_when_the_oldest_waits_too_long(files: Files) -> None:
    files.emit("e-1", clock=FrozenClock(datetime.now(UTC) - timedelta(hours=1)))
    result = files.status("--require", "none", "--max-age", "600", code=1)
    [line] = reasons(result)
    assert line.startswith("unhealthy: oldest event: 60 min old, sent ") and "over 10 min" in line
    files.status("--require", "none", "--max-age", "7200", code=0)


def old_message(files: Files, event_id: str) -> None:
    """A batch as sent before producers stamped a send time."""
    app = make_celery(files.broker)
    try:
        batch = encode_batch(
            [{"id": event_id, "charges": [["s", "calls", 1]], "at": 1, "meta": None}]
        )
        app.send_task(APPLY_BATCH_TASK, args=[batch], queue="metering", routing_key="metering")
    finally:
        app.close()


def test_messages_without_a_send_time_still_count(files: Files) -> None:
    old_message(files, "legacy-1")
    broker = open_queues(files.broker)
    try:
        [message] = broker.messages(["metering"])
        assert message.event_ids == ("legacy-1",) and message.sent_at_us is None
        assert queued_event_ids(broker, ["legacy-1", "other"], ["metering"]) == {"legacy-1"}
    finally:
        broker.close()
    report = as_json(files.status("--require", "none", "--format", "json", code=0))
    assert report["oldest_event"] is None
    assert check_of(report, "oldest event")["detail"] == (
        "unknown: 1 queued batches carry no send time"
    )


def test_the_producer_stamps_its_clock_on_each_message(files: Files) -> None:
    files.emit("e-1", clock=FrozenClock(T0))
    with sqlite3.connect(files.broker_file) as connection:
        [(payload,)] = connection.execute("SELECT payload FROM kombu_message").fetchall()
    headers = json.loads(payload)["headers"]
    assert headers[SENT_AT_HEADER] == int(T0.timestamp()) * 1_000_000


# -- heartbeats -----------------------------------------------------------------------------


def status_at(files: Files, seconds: float, **options: object) -> dict[str, object]:
    report = collect_status(
        files.database,
        files.broker,
        clock=FrozenClock(T0 + timedelta(seconds=seconds)),
        queues=["metering"],
        **options,
    )
    return {"healthy": report.healthy, "reasons": report.reasons, **report.facts}


@pytest.mark.usefixtures("sqlite_url")
def test_a_worker_is_alive_while_its_heartbeat_is_recent(files: Files) -> None:
    record_heartbeat(files.database, WORKER, "w1@host", FrozenClock(T0))
    fresh = status_at(files, ALIVE_WITHIN_SECONDS)
    assert fresh["healthy"] is True
    assert fresh["workers"] == {"method": "heartbeat", "alive": ["w1@host"]}
    stale = status_at(files, ALIVE_WITHIN_SECONDS + 1)
    assert stale["healthy"] is False
    assert stale["reasons"] == [
        "workers: no heartbeat from a worker within 30 s: w1@host last 31 s ago (by heartbeat)"
    ]


@pytest.mark.usefixtures("sqlite_url")
def test_node_asks_for_one_worker_by_name(files: Files) -> None:
    record_heartbeat(files.database, WORKER, "w1@host", FrozenClock(T0))
    assert status_at(files, 5, node="w1@host")["healthy"] is True
    other = status_at(files, 5, node="w2@host")
    assert other["reasons"] == ["workers: no heartbeat from worker w2@host ever (by heartbeat)"]


@pytest.mark.usefixtures("sqlite_url")
def test_a_worker_that_stopped_forgets_its_heartbeat(files: Files) -> None:
    record_heartbeat(files.database, WORKER, "w1@host", FrozenClock(T0))
    forget_heartbeat(files.database, WORKER, "w1@host")
    assert status_at(files, 1)["reasons"] == [
        "workers: no heartbeat from a worker ever (by heartbeat)"
    ]


@pytest.mark.usefixtures("sqlite_url")
def test_beat_is_required_only_when_asked(files: Files) -> None:
    record_heartbeat(files.database, WORKER, "w1@host", FrozenClock(T0))
    never = status_at(files, 1, require=frozenset({"worker", "beat"}))
    assert never["reasons"] == ["beat: never seen: no heartbeat from beat yet"]
    assert status_at(files, 1)["healthy"] is True  # the default asks for workers only
    record_heartbeat(files.database, BEAT, "beat@host", FrozenClock(T0))
    seen = status_at(files, 12, require=frozenset({"beat"}))
    assert seen["healthy"] is True
    assert seen["beat"] == {
        "method": "heartbeat",
        "name": "beat@host",
        "last_seen": "2026-11-22T12:00:00+00:00",
        "alive": ["beat@host"],
    }
    gone = status_at(files, 600, require=frozenset({"beat"}))
    assert gone["reasons"] == [
        "beat: beat@host last seen 10 min ago, at 2026-11-22 12:00:00 UTC (by heartbeat)"
    ]


@pytest.mark.usefixtures("sqlite_url")
def test_heartbeats_of_processes_gone_a_week_are_deleted(files: Files) -> None:
    record_heartbeat(files.database, WORKER, "gone@host", FrozenClock(T0))
    record_heartbeat(files.database, WORKER, "w1@host", FrozenClock(T0 + timedelta(days=8)))
    probe = DatabaseProbe(files.database)
    try:
        assert set(probe.heartbeats(WORKER)) == {"w1@host"}
    finally:
        probe.close()


# -- result: pending ---------------------------------------------------------------------


@pytest.mark.usefixtures("sqlite_url")
def test_a_queued_event_is_pending_with_exit_3(files: Files) -> None:
    files.emit("e-1")
    result = files.run("result", "e-1", "--broker", files.broker, code=3)
    assert result.stdout == "pending  event e-1 is queued: no worker has decided it yet\n"
    as_json = files.run("result", "e-1", "--broker", files.broker, "--format", "json", code=3)
    assert json.loads(as_json.stdout) == {"event_id": "e-1", "outcome": "pending"}
    # Taken by a worker and not yet applied: still pending.
    with sqlite3.connect(files.broker_file) as connection:
        connection.execute("UPDATE kombu_message SET visible = 0")
    assert is_queued(files.broker, "e-1")
    files.run("result", "e-1", "--broker", files.broker, code=3)
    # An id never seen keeps its answer.
    unknown = files.run("result", "e-2", "--broker", files.broker, code=1)
    assert unknown.stderr == "error: no result for event e-2\n"


@pytest.mark.usefixtures("sqlite_url")
def test_an_applied_event_shows_its_result_though_its_message_remains(files: Files) -> None:
    files.emit("e-1")
    with Meter(files.database) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1d"))
        with sqlite3.connect(files.broker_file) as connection:
            [(payload,)] = connection.execute("SELECT payload FROM kombu_message").fetchall()
        envelope = json.loads(payload)
        apply_batch(meter, json.loads(base64.b64decode(envelope["body"]))[0][0])
    result = files.run("result", "e-1", "--broker", files.broker, code=0)
    assert result.stdout.startswith("allowed  org-e-1 calls  used 1/5")


@pytest.mark.usefixtures("sqlite_url")
def test_a_broker_that_cannot_be_searched_is_said_with_the_missing_result(files: Files) -> None:
    result = files.run("result", "e-1", "--broker", "redis://127.0.0.1:1/0", code=1)
    assert result.stderr.startswith("error: no result for event e-1; broker unreachable: ")
    assert len(result.stderr.splitlines()) == 1


BEAT_TICK = """
import sys
from datetime import datetime
from metering import FrozenClock
from metering.settings import Settings
from workers.app import create_app
from workers.beat import HeartbeatScheduler
database, broker, schedule, at = sys.argv[1:]
app = create_app(broker, Settings(database_url=database, broker_url=broker))
clock = FrozenClock(datetime.fromisoformat(at))
scheduler = HeartbeatScheduler(app=app, schedule_filename=schedule, clock=clock)
scheduler.tick()
scheduler.close()
"""


def beat_ticks_in_a_process_of_its_own(files: Files, number: int, at: datetime) -> None:
    schedule = str(files.directory / f"beat-schedule-{number}")
    command = [sys.executable, "-c", BEAT_TICK, files.database, files.broker, schedule]
    subprocess.run([*command, at.isoformat()], check=True, timeout=60)


@pytest.mark.slow
def test_two_beats_on_one_host_both_show_and_status_warns(files: Files) -> None:
    now = datetime.now(UTC)  # the command reads the system clock
    record_heartbeat(files.database, WORKER, "w1@host", FrozenClock(now))
    beat_ticks_in_a_process_of_its_own(files, 1, now)
    alone = as_json(files.status("--format", "json", code=0))
    assert len(alone["beat"]["alive"]) == 1  # type: ignore[index]
    assert "beats" not in [check["check"] for check in alone["checks"]]  # type: ignore[union-attr]
    beat_ticks_in_a_process_of_its_own(files, 2, now)

    both = files.status("--format", "json", code=0)
    report = as_json(both)
    alive = report["beat"]["alive"]  # type: ignore[index]
    assert len(alive) == 2 and all(name.endswith(f"@{socket.gethostname()}") for name in alive)
    beats = check_of(report, "beats")
    assert beats["state"] == "warn" and beats["required"] is False
    assert str(beats["detail"]).startswith("2 beats alive, one is enough")
    assert report["healthy"] is True and both.stderr == ""
    text = files.status(code=0).stdout
    assert "beats" in text and "2 beats alive" in text


@pytest.mark.usefixtures("sqlite_url")
def test_a_beat_gone_quiet_is_not_counted_as_a_second_one(files: Files) -> None:
    record_heartbeat(files.database, BEAT, "beat.1@host", FrozenClock(T0))
    record_heartbeat(files.database, BEAT, "beat.2@host", FrozenClock(T0 + timedelta(minutes=5)))
    report = status_at(files, 5 * 60 + 1)
    assert report["beat"]["alive"] == ["beat.2@host"]  # type: ignore[index]
    assert "beats" not in [
        c.name
        for c in collect_status(
            files.database,
            files.broker,
            clock=FrozenClock(T0 + timedelta(minutes=5)),
            queues=["metering"],
        ).checks
    ]


# -- rejected input ----------------------------------------------------------------------


@pytest.mark.usefixtures("sqlite_url")
def test_events_rejected_in_the_last_day_are_a_warning(files: Files) -> None:
    event = make_event([("org-42", "api_cals", 1)], T0, "typo-1")
    with Meter(files.database, clock=FrozenClock(T0)) as meter:
        apply_batch(meter, encode_batch([encode_event(event)]))  # as a worker does

    def report_at(at: datetime) -> dict[str, object]:
        clock = FrozenClock(at)
        found = collect_status(
            files.database, files.broker, clock=clock, queues=["metering"], require=frozenset()
        )
        return found.to_dict()

    day = report_at(T0 + timedelta(hours=23))
    check = check_of(day, "rejected")
    assert (check["state"], check["required"]) == ("warn", False)
    assert check["detail"] == "1 rejected in the last day: see `metering rejected`"
    assert day["rejected_last_day"] == 1 and day["healthy"] is True
    later = report_at(T0 + timedelta(hours=25))
    assert check_of(later, "rejected")["state"] == "ok"
    assert later["rejected_last_day"] == 0


def test_connections_in_use_are_shown_on_postgresql(files: Files, pg_url: str) -> None:
    # A meter of this test holds some connections (its processes are named
    # "metering" on the server): status counts them against the server's room.
    with Meter(pg_url) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1d"))
        meter.consume("org-1", "calls")
        held = meter.connections_in_use()
        assert held is not None and held >= 1
        report = collect_status(
            pg_url, files.broker, clock=FrozenClock(T0), queues=["metering"], require=frozenset()
        )
    [check] = [c for c in report.checks if c.name == "connections"]
    assert check.ok and not check.required
    seen = report.facts["database"]["connections"]
    assert seen["metering"] >= held + 1  # the meter's, and the probe's own
    assert seen["in_use"] >= seen["metering"]
    assert seen["max"] == 200  # the test server's max_connections
    assert f"{seen['metering']} by metering" in check.detail
