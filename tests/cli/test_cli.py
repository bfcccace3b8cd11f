"""The `metering` command line, through click's CliRunner on a SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from metering import Meter
from metering.cli import main
from metering.storage.schema_revision import SCHEMA_REVISION

Run = Callable[..., Result]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite file (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    """Run ``metering --database URL ARGS...``; check the exit code when told."""
    runner = CliRunner()

    def invoke(*args: str, code: int | None = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    return invoke


@pytest.fixture
def with_limits(run: Run) -> Run:
    run("limits", "set", "send_message", "--max", "5", "--period", "2m")
    run("limits", "set", "org_calls", "--max", "3", "--period", "1h", "--window", "calendar")
    return run


def utc_text(iso: str) -> str:
    """How the CLI prints a reset time: whole seconds, rounded up."""
    moment = datetime.fromisoformat(iso)
    if moment.microsecond:
        moment = moment.replace(microsecond=0) + timedelta(seconds=1)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def snapshot(url: str) -> tuple[list[Any], list[Any]]:
    with Meter(url) as meter:
        return meter.list_limits(), meter.counters()


def assert_one_line_error(result: Result) -> None:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""


# -- the README scenario ---------------------------------------------------------


def test_the_readme_s_block_without_docker_starts_the_one_beat() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("**Without Docker**", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    [worker] = [line for line in block.splitlines() if line.startswith("metering worker")]
    assert " --beat " in worker + " "


@pytest.mark.slow
def test_the_readme_s_python_snippet_runs_twice(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    snippet = readme.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for _ in range(2):  # the second run starts from a fresh database too
        done = subprocess.run(
            [sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left in the working directory


# -- operator commands ---------------------------------------------------------------


def test_limits_list_and_delete(with_limits: Run, url: str) -> None:
    table = with_limits("limits", "list").output
    for text in ("name", "maximum", "thresholds", "lateness", "send_message", "org_calls"):
        assert text in table
    listed = json.loads(with_limits("limits", "list", "--format", "json").output)
    assert [entry["name"] for entry in listed] == ["org_calls", "send_message"]
    assert listed[0]["window"] == "calendar" and listed[1]["period"] == "2m"
    assert with_limits("limits", "delete", "org_calls").output == "deleted limit org_calls\n"
    assert [limit.name for limit in snapshot(url)[0]] == ["send_message"]
    assert_one_line_error(with_limits("limits", "delete", "org_calls", code=None))


def test_limits_set_with_every_option(run: Run, url: str) -> None:
    args = ["--max", "10", "--period", "10s", "--algorithm", "token_bucket", "--lateness", "1h"]
    out = run("limits", "set", "search", *args).output
    assert out == "search: max 10 per 10s, token_bucket, hard, lateness 1h\n"
    [limit] = snapshot(url)[0]
    assert (limit.algorithm, limit.lateness, limit.maximum) == ("token_bucket", "1h", 10)


def test_limits_load_yaml_and_toml(run: Run, url: str, tmp_path: Path) -> None:
    yaml_file = tmp_path / "limits.yaml"
    yaml_file.write_text(
        "limits:\n"
        "  send_message: {maximum: 5, period: 2m}\n"
        "  api_calls: {maximum: 1000, period: 1mo, window: calendar, enforcement: soft,"
        " thresholds: [80, 100]}\n"
    )
    assert run("limits", "load", str(yaml_file)).output == f"loaded 2 limits from {yaml_file}\n"
    toml_file = tmp_path / "limits.toml"
    toml_file.write_text(
        '[[limits]]\nname = "search"\nmaximum = 10\nperiod = "10s"\nalgorithm = "token_bucket"\n'
    )
    assert run("limits", "load", str(toml_file)).output == f"loaded 1 limit from {toml_file}\n"
    limits = {limit.name: limit for limit in snapshot(url)[0]}
    assert sorted(limits) == ["api_calls", "search", "send_message"]
    assert limits["api_calls"].thresholds == (80, 100)


def test_db_upgrade_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"  # no schema yet
    runner = CliRunner()
    out = runner.invoke(main, ["--database", url, "db", "upgrade"]).output
    assert out == f"schema at revision {SCHEMA_REVISION} ({url})\n"
    assert runner.invoke(main, ["--database", url, "db", "upgrade"]).output == out  # idempotent
    assert snapshot(url) == ([], [])


def test_db_upgrade_on_postgresql(postgres_server: Any) -> None:
    postgres_server.create_database("cli_upgrade")
    try:
        url = postgres_server.url("cli_upgrade")
        runner = CliRunner()
        before = runner.invoke(main, ["--database", url, "limits", "list"])
        assert_one_line_error(before)
        assert "metering db upgrade" in before.stderr
        upgraded = runner.invoke(main, ["--database", url, "db", "upgrade"])
        assert upgraded.exit_code == 0, upgraded.output
        assert f"schema at revision {SCHEMA_REVISION}" in upgraded.output
        args = ["--database", url, "limits", "set", "a", "--max", "1", "--period", "1m"]
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
    finally:
        postgres_server.drop_database("cli_upgrade")


def test_database_url_from_the_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METERING_DATABASE_URL", url)
    result = CliRunner().invoke(main, ["limits", "set", "x", "--max", "1", "--period", "1m"])
    assert result.exit_code == 0, result.output
    assert [limit.name for limit in snapshot(url)[0]] == ["x"]


# -- bad input: one error line, exit 1, nothing changed ----------------------------------

BAD_INPUTS = {
    "unknown limit": ["consume", "visitor-1", "nope"],
    "cost 0": ["consume", "visitor-1", "send_message", "--cost", "0"],
    "cost -1": ["consume", "visitor-1", "send_message", "--cost", "-1"],
    "cost 1.5": ["consume", "visitor-1", "send_message", "--cost", "1.5"],
    "huge cost": ["consume", "visitor-1", "send_message", "--cost", "1" + "0" * 30],
    "empty subject": ["consume", "", "send_message"],
    "control character subject": ["consume", "bad\nsubject", "send_message"],
    "overlong subject": ["consume", "s" * 201, "send_message"],
    "malformed event id": ["consume", "visitor-1", "send_message", "--event-id", "bad id!"],
    "malformed result id": ["result", "bad id!"],
    "bad period": ["limits", "set", "send_message", "--max", "9", "--period", "2 fortnights"],
    "bad maximum": ["limits", "set", "send_message", "--max", "0", "--period", "1m"],
    "bad limit name": ["limits", "set", "Send Message", "--max", "1", "--period", "1m"],
    "soft bucket": [
        "limits",
        "set",
        "send_message",
        "--max",
        "9",
        "--period",
        "1m",
        "--algorithm",
        "token_bucket",
        "--enforcement",
        "soft",
    ],
    "bad algorithm": ["limits", "set", "x", "--max", "1", "--period", "1m", "--algorithm", "y"],
    "missing limits file": ["limits", "load", "/nonexistent/limits.yaml"],
    "unknown option": ["consume", "visitor-1", "send_message", "--bogus"],
    "unknown command": ["frobnicate"],
    "no charge": ["consume"],
    "charge and subject": ["consume", "v", "send_message", "--charge", "v:org_calls:1"],
    "malformed charge": ["consume", "--charge", "visitor-1"],
    "fractional charge cost": ["consume", "--charge", "visitor-1:send_message:1.5"],
    "repeated charge": ["consume", "--charge", "v:send_message:1", "--charge", "v:send_message:2"],
    "bad --at": ["consume", "visitor-1", "send_message", "--at", "yesterday"],
    "--at too old": ["consume", "visitor-1", "send_message", "--at", "2001-01-01T00:00:00"],
    "--at in the future": ["consume", "visitor-1", "send_message", "--at", "2999-01-01"],
    "conflicting event id": [
        "consume",
        "visitor-1",
        "send_message",
        "--cost",
        "2",
        "--event-id",
        "seen-1",
    ],
    "reset bad subject": ["reset", "--subject", ""],
    "unknown limit check": ["check", "visitor-1", "nope"],
}


@pytest.mark.parametrize("args", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_gives_one_error_line_and_changes_nothing(
    with_limits: Run, url: str, args: list[str]
) -> None:
    with_limits("consume", "visitor-1", "send_message", "--event-id", "seen-1")
    before = snapshot(url)
    assert_one_line_error(with_limits(*args, code=None))
    assert snapshot(url) == before


def test_unreachable_database_gives_one_error_line() -> None:
    runner = CliRunner()
    for args in (["limits", "list"], ["consume", "v", "x"], ["db", "upgrade"]):
        result = runner.invoke(main, ["--database", "postgresql://nobody@127.0.0.1:1/x", *args])
        assert_one_line_error(result)
        assert "database unavailable" in result.stderr


def test_unsupported_database_url_gives_one_error_line() -> None:
    result = CliRunner().invoke(main, ["--database", "mysql://localhost/x", "limits", "list"])
    assert_one_line_error(result)


@pytest.mark.slow
def test_python_dash_m_prints_errors_without_traceback(url: str) -> None:
    command = [sys.executable, "-m", "metering", "--database", url, "consume", "v", "nope"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == "error: unknown limit 'nope': define it with `metering limits set`\n"


# -- groups ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [[], ["limits"], ["webhooks"], ["report"], ["reservations"], ["db"]], ids=str
)
def test_a_bare_group_prints_its_help_and_exits_0(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.startswith(f"Usage: {' '.join(['metering', *args])} [OPTIONS] COMMAND")
    listed = "Commands:" in result.stdout or "Limits and customers:" in result.stdout  # the root
    assert listed and "error" not in result.output
