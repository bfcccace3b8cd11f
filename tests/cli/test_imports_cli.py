"""``metering import``: a file, standard input (a real process), the summary
and its exit code, bad lines on stderr with their numbers, ``--strict``, the
progress bar with events/s, and bad input as one ``error:`` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from metering import Limit, Meter
from metering.cli import main

Run = Callable[..., Result]
AT = datetime.now(UTC).replace(microsecond=0).isoformat()


def line(event_id: str, cost: int = 1) -> str:
    event = {"event_id": event_id, "subject": "org-1", "limit": "calls", "cost": cost}
    return json.dumps({**event, "occurred_at": AT}) + "\n"


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str, code: int | None = 0, stdin: str | None = None) -> Result:
        result = runner.invoke(main, ["--database", url, *args], input=stdin)
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    invoke("limits", "set", "calls", "--max", "3", "--period", "1d", "--window", "calendar")
    return invoke


def test_a_file_then_again_reports_the_duplicates(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(line(f"e{i}") for i in range(4)))
    first = run("import", str(path))
    assert first.stdout == (
        "4 events: 3 applied, 1 denied, 0 rejected, 0 already there (duplicates), "
        "0 conflicts; 0 bad lines\n"
    )
    again = run("import", str(path), "--output", "json")
    summary = json.loads(again.stdout)
    assert (summary["applied"], summary["duplicates"]) == (0, 4)


def test_bad_lines_go_to_stderr_with_their_numbers_and_exit_1(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "events.csv"
    path.write_text(
        f"event_id,subject,limit,cost,occurred_at,region\nc1,org-1,calls,1,{AT},eu\n"
        f"c2,org-1,calls,x,{AT},eu\nc3,org-1,calls,1,yesterday,eu\n"
    )
    result = run("import", str(path), code=1)
    assert result.stdout.startswith("1 events: 1 applied")
    first, second = result.stderr.splitlines()
    assert first == "bad line 3: cost: must be a whole number, got 'x'"
    assert second.startswith("bad line 4: occurred_at: 'yesterday'")
    strict = run("import", str(path), "--strict", code=1)
    assert strict.stderr.startswith("error: file: line 3: cost")
    assert "Traceback" not in strict.output


def test_progress_shows_events_per_second(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(line(f"e{i}") for i in range(3)))
    result = run("import", str(path), "--progress", "--batch-size", "1")
    assert "3 events" in result.stderr and "events/s" in result.stderr


def test_bad_input_is_one_error_line(run: Run, tmp_path: Path) -> None:
    missing = run("import", str(tmp_path / "missing.jsonl"), code=1)
    assert missing.stderr.startswith("error: file: cannot read") and missing.stdout == ""
    header = tmp_path / "bad.csv"
    header.write_text("id,subject\n")
    result = run("import", str(header), code=1)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: header: line 1")


@pytest.mark.slow
def test_standard_input_in_a_real_process(url: str, tmp_path: Path) -> None:
    with Meter(url) as meter:
        meter.set_limit(Limit("calls", maximum=3, period="1d", window="calendar"))
    command = [sys.executable, "-m", "metering", "--database", url, "import", "-"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    body = "".join(line(f"s{i}") for i in range(2))
    done = subprocess.run(command, input=body, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("2 events: 2 applied")
    again = subprocess.run(
        command, input=body, capture_output=True, text=True, env=env, check=False
    )
    assert "2 already there (duplicates)" in again.stdout
