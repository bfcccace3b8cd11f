"""``metering emit|worker|rejected`` (`metering/cli/queue.py`): an event queued
(or refused in one line before anything is queued), what could not be applied
listed and replayed once, and the worker's command line for the embedded
broker and for Redis (its concurrency, beat's schedule, its queues)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from metering import Limit, Meter
from metering.cli import main
from metering.domain.events import make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event


def test_emit_queues_an_event_and_prints_its_id(tmp_path: Path) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    result = CliRunner().invoke(
        main,
        ["emit", "org-42", "api_calls", "--cost", "3", "--event-id", "e-1", "--broker", broker],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.output.strip() == "e-1"
    as_json = CliRunner().invoke(
        main, ["emit", "--charge", "u:calls:1", "--format", "json", "--broker", broker]
    )
    assert as_json.exit_code == 0, (as_json.output, as_json.exception)
    assert len(json.loads(as_json.output)["event_id"]) == 32
    with sqlite3.connect(tmp_path / "broker.db") as connection:
        assert connection.execute("SELECT count(*) FROM kombu_message").fetchone() == (2,)


def test_emit_refuses_an_unknown_limit_of_its_database_in_one_line(
    tmp_path: Path, sqlite_url: str
) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    database = sqlite_url
    with Meter(database) as meter:
        meter.set_limit(Limit("api_calls", maximum=10, period="1h"))
    result = CliRunner().invoke(
        main, ["--database", database, "emit", "org-42", "api_cals", "--broker", broker]
    )
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        "error: unknown limit 'api_cals': define it with `metering limits set`"
    ]
    assert not (tmp_path / "broker.db").exists()


def test_emit_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    result = CliRunner().invoke(main, ["emit", "s", "calls", "--cost", "-1", "--broker", broker])
    assert result.exit_code == 1
    assert result.output.strip().startswith("error: cost")
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_rejected_lists_what_could_not_be_applied(sqlite_url: str) -> None:
    url = sqlite_url
    empty = CliRunner().invoke(main, ["--database", url, "rejected"])
    assert empty.exit_code == 0 and "no rejected messages" in empty.output
    with Meter(url) as meter:
        apply_batch(meter, {"nope": 1})
    listed = CliRunner().invoke(main, ["--database", url, "rejected", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert row["event_id"] is None and "not a metering batch" in row["reason"]


def test_rejected_lists_rejected_events_and_replay_applies_them_once(sqlite_url: str) -> None:
    url = sqlite_url
    event = make_event([("org-42", "api_cals", 3)], datetime.now(UTC), "typo-1")
    with Meter(url) as meter:
        apply_batch(meter, encode_batch([encode_event(event)]))  # as a worker does
    listed = CliRunner().invoke(main, ["--database", url, "rejected"])
    assert listed.exit_code == 0, listed.output
    assert "typo-1" in listed.output and "unknown limit 'api_cals'" in listed.output
    waiting = CliRunner().invoke(main, ["--database", url, "rejected", "replay"])
    assert waiting.exit_code == 0, waiting.output
    assert waiting.output.startswith("replayed 0 events; 1 still rejected")
    with Meter(url) as meter:
        meter.set_limit(Limit("api_cals", maximum=10, period="1h"))
    for expected in ("replayed 1 event (1 allowed); 0 still rejected", "replayed 0 events"):
        done = CliRunner().invoke(main, ["--database", url, "rejected", "replay"])
        assert done.exit_code == 0, done.output
        assert done.output.startswith(expected)
    with Meter(url) as meter:
        assert sum(c.used for c in meter.counters("org-42", "api_cals")) == 3
    empty = CliRunner().invoke(main, ["--database", url, "rejected"])
    assert "no rejected messages" in empty.output


def test_the_embedded_worker_says_it_runs_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's banner showed 'concurrency: 2 (solo)': a solo pool is one process."""
    started: list[list[str]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, _env: started.append(argv))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_BROKER_URL", raising=False)
    result = CliRunner().invoke(main, ["worker"])
    assert result.exit_code == 0, (result.output, result.exception)
    [argv] = started
    assert argv[argv.index("--pool") + 1] == "solo"
    assert argv[argv.index("--concurrency") + 1] == "1"
    asked = CliRunner().invoke(main, ["worker", "--concurrency", "4"])
    assert asked.exit_code == 0, (asked.output, asked.exception)
    assert started[1][started[1].index("--concurrency") + 1] == "1"
    assert asked.stderr == (
        "warning: the embedded broker runs one worker process: --concurrency 4 is ignored"
        " (use Redis for more)\n"
    )


@pytest.fixture
def in_tmp_path(tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's directory as the working one, its default ./metering.db
    migrated (`sqlite_url`): `metering worker` checks that database first."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.usefixtures("in_tmp_path")
def test_a_redis_worker_gets_the_concurrency_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, _env: started.append(argv))
    broker = "redis://127.0.0.1:1/0"
    result = CliRunner().invoke(main, ["worker", "--concurrency", "3", "--broker", broker])
    assert result.exit_code == 0, (result.output, result.exception)
    [argv] = started
    assert argv[argv.index("--concurrency") + 1] == "3" and "--pool" not in argv


def test_the_embedded_worker_keeps_beat_s_schedule_in_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, _env: started.append(argv))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_BROKER_URL", raising=False)
    monkeypatch.delenv("METERING_HOME", raising=False)
    assert CliRunner().invoke(main, ["worker"]).exit_code == 0
    monkeypatch.setenv("METERING_HOME", str(tmp_path / "home"))
    assert CliRunner().invoke(main, ["worker", "--beat"]).exit_code == 0
    schedules = [Path(argv[argv.index("--schedule") + 1]) for argv in started]
    assert schedules == [
        tmp_path / ".metering" / "beat-schedule",
        tmp_path / "home" / "beat-schedule",
    ]
    assert all(schedule.parent.is_dir() for schedule in schedules)


@pytest.mark.parametrize(
    ("args", "environ", "queues"),
    [
        ([], {}, "metering"),
        (["--queues", "2"], {}, "metering,metering.0,metering.1"),
        ([], {"METERING_QUEUES": "3"}, "metering,metering.0,metering.1,metering.2"),
    ],
)
@pytest.mark.usefixtures("in_tmp_path")
def test_a_worker_consumes_the_default_queue_beside_the_routed_ones(
    args: list[str], environ: dict[str, str], queues: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--queues 2` consumed metering.0 and .1 but never `metering`, where beat,
    `metering emit` and one-queue producers publish; METERING_QUEUES was ignored."""
    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, env: started.append((argv, env)))
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(main, ["worker", "--broker", "redis://127.0.0.1:1/0", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    [(argv, env)] = started
    assert argv[argv.index("--queues") + 1] == queues
    assert env["METERING_QUEUES"] == str(queues.count(",") or 1)
