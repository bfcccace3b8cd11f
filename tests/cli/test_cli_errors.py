"""Inputs that once reached a traceback: now one ``error:`` line and exit 1.

Each case is run through click's CliRunner (or as a subprocess where the
command would replace the process, as ``metering worker`` does) and must
print exactly one ``error: ...`` line on stderr, nothing on stdout, no
traceback, and change nothing stored.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from metering import FrozenClock, Limit, Meter
from metering.api.parsing import parse_events
from metering.api.problems import ApiProblem
from metering.cli import main
from metering.cli.output import decision_lines

Run = Callable[..., Result]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(main, ["--database", url, *args])

    return invoke


def assert_one_line_error(result: Result, *needles: str) -> str:
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- METERING_HOME that cannot hold files ------------------------------------------


def unusable_homes(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """METERING_HOME values the command line cannot use, and what the error says."""
    regular = tmp_path / "a-file"
    regular.write_text("not a directory\n")
    return {
        "a regular file": (str(regular), "is a file, not a directory"),
        "under a regular file": (str(regular / "sub"), "a part of its path is a file"),
        "in /proc": ("/proc/metering-home", "cannot be created"),
        "/proc itself": ("/proc", "does not take files"),
    }


CASES = ["a regular file", "under a regular file", "in /proc", "/proc itself"]


@pytest.mark.parametrize("case", CASES)
def test_demo_with_an_unusable_metering_home_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    home, message = unusable_homes(tmp_path)[case]
    monkeypatch.setenv("METERING_HOME", home)
    assert_one_line_error(CliRunner().invoke(main, ["demo"]), f"METERING_HOME={home}", message)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_worker_with_an_unusable_metering_home_is_one_error_line(tmp_path: Path, case: str) -> None:
    """A subprocess: `metering worker` replaces its process with celery when it starts."""
    home, message = unusable_homes(tmp_path)[case]
    env = dict(
        os.environ,
        METERING_HOME=home,
        METERING_DATABASE_URL=f"sqlite:///{tmp_path}/w.db",
        METERING_BROKER_URL=f"sqla+sqlite:///{tmp_path}/broker.db",
    )
    done = subprocess.run(
        [sys.executable, "-m", "metering", "worker"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(f"error: METERING_HOME={home} "), done.stderr
    assert message in done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


# -- limits and entitlements files ---------------------------------------------------------


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("group", ["limits", "entitlements"])
def test_a_file_that_is_not_utf8_is_one_error_line(run: Run, tmp_path: Path, group: str) -> None:
    bad = write_bytes(tmp_path / "bad.yaml", b"api:\n  maximum: 5\n  period: \xff1m\n")
    line = assert_one_line_error(run(group, "load", str(bad)))
    assert line == f"error: {bad}: not UTF-8 text (byte 0xff at offset 28)"


NESTED = {
    # 600, not 5000: PyYAML's scanner takes seconds over thousands of open
    # brackets, and its parser already runs out of Python's recursion limit
    # (1000 frames, two or more a level) at 600.
    "yaml list": ("deep.yaml", "api: " + "[" * 600 + "]" * 600 + "\n"),
    "yaml mapping": ("deep.yaml", "api: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"),
    "yaml under a limit": (
        "deep.yaml",
        "api:\n  maximum: 5\n  period: 1m\n  thresholds: " + "[" * 300 + "]" * 300 + "\n",
    ),
    "toml array": ("deep.toml", "api = " + "[" * 5000 + "]" * 5000 + "\n"),
    "toml inline table": ("deep.toml", "api = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"),
}


@pytest.mark.parametrize("group", ["limits", "entitlements"])
@pytest.mark.parametrize("case", list(NESTED), ids=list(NESTED))
def test_deeply_nested_yaml_or_toml_is_one_error_line(
    run: Run, url: str, tmp_path: Path, group: str, case: str
) -> None:
    name, text = NESTED[case]
    path = tmp_path / name
    path.write_text(text)
    line = assert_one_line_error(run(group, "load", str(path)))
    assert line == f"error: {path}: nested more than 32 levels deep"
    with Meter(url) as meter:
        assert meter.list_limits() == []


def test_a_duplicate_yaml_key_is_an_error_naming_the_key_and_its_lines(
    run: Run, url: str, tmp_path: Path
) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("api:\n  maximum: 5\n  period: 1m\n  maximum: 50\n")
    line = assert_one_line_error(run("limits", "load", str(path)))
    assert line == (
        f"error: {path}: not valid YAML: line 4: key 'maximum' is repeated (first on line 2)"
    )
    with Meter(url) as meter:
        assert meter.list_limits() == []


def test_a_duplicate_limit_name_in_yaml_is_an_error(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("api:\n  maximum: 5\n  period: 1m\napi:\n  maximum: 9\n  period: 1m\n")
    assert_one_line_error(
        run("limits", "load", str(path)), "line 4: key 'api' is repeated (first on line 1)"
    )


def test_a_duplicate_key_in_an_entitlements_entry_is_an_error(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "entitlements.yaml"
    path.write_text("- subject: org-1\n  limit: api\n  maximum: 5\n  maximum: 500\n")
    assert_one_line_error(
        run("entitlements", "load", str(path)),
        "line 4: key 'maximum' is repeated (first on line 3)",
    )


def test_yaml_merge_keys_still_override(run: Run, url: str, tmp_path: Path) -> None:
    """``<<`` merges are YAML's own way to override: not duplicates."""
    path = tmp_path / "limits.yaml"
    path.write_text("base: &base\n  maximum: 5\n  period: 1m\napi:\n  <<: *base\n  period: 2m\n")
    result = run("limits", "load", str(path))
    assert result.exit_code == 0, result.output
    with Meter(url) as meter:
        assert {limit.name: limit.period for limit in meter.list_limits()} == {
            "api": "2m",
            "base": "1m",
        }


# -- one rounding for every time shown ---------------------------------------------------


def test_counters_and_decisions_show_a_windows_end_at_the_same_second(run: Run, url: str) -> None:
    """The window opens at 04:40:08.5: it ends, and resets, at 04:45:08.5,
    shown as 04:45:09 by `counters` and by the decision alike."""
    opened = datetime(2026, 11, 26, 4, 40, 8, 500_000, tzinfo=UTC)
    with Meter(url, clock=FrozenClock(opened)) as meter:
        meter.set_limit(Limit("api", maximum=5, period="5m"))
        decision = meter.consume("org-1", "api", event_id="e-1")
    assert decision.resets_at == datetime(2026, 11, 26, 4, 45, 8, 500_000, tzinfo=UTC)
    shown_end = "2026-11-26 04:45:09 UTC"
    [line] = decision_lines(decision)
    assert line.endswith(f"resets {shown_end}")
    assert f"resets {shown_end}" in run("result", "e-1").stdout
    counters = run("counters").stdout
    assert "2026-11-26 04:40:09\u201304:45:09" in counters  # the window, in UTC
    assert "04:45:08" not in counters


# -- RFC 3339 only -------------------------------------------------------------------------

WEEK_DATE = "2026-W48-4T05:00:00Z"


def test_an_iso_week_or_ordinal_date_is_refused_by_the_cli(run: Run, url: str) -> None:
    run("limits", "set", "api", "--max", "5", "--period", "1h")
    line = assert_one_line_error(run("consume", "org-1", "api", "--at", WEEK_DATE))
    assert line == (
        f"error: Invalid value for '--at': '{WEEK_DATE}' is not an RFC 3339 time like "
        "2026-11-22T12:00:00Z (ISO week dates such as 2026-W48-4 are not accepted) "
        "(see 'metering consume --help')"
    )
    line = assert_one_line_error(run("report", "overage", "--since", "2026-330"))
    assert line == (
        "error: since: '2026-330' is not an RFC 3339 time like 2026-11-22T12:00:00Z "
        "(ordinal dates such as 2026-330 are not accepted)"
    )
    assert_one_line_error(
        run("grants", "add", "org-1", "api", "5", "--expires", "2026-W53"), "ISO week dates"
    )
    with Meter(url) as meter:
        assert meter.counters() == [] and meter.grants() == []


def test_an_iso_week_date_is_refused_in_an_entitlements_file(
    run: Run, url: str, tmp_path: Path
) -> None:
    run("limits", "set", "api", "--max", "5", "--period", "1h")
    path = tmp_path / "entitlements.yaml"
    path.write_text(
        f"- subject: org-1\n  limit: api\n  maximum: 50\n  effective_from: '{WEEK_DATE}'\n"
    )
    line = assert_one_line_error(run("entitlements", "load", str(path)))
    assert line.endswith(
        f"effective_from: '{WEEK_DATE}' is not an RFC 3339 time like 2026-11-22T12:00:00Z "
        "(ISO week dates such as 2026-W48-4 are not accepted)"
    )
    with Meter(url) as meter:
        assert meter.entitlements() == []


def test_an_iso_week_date_is_refused_as_an_http_events_time() -> None:
    body = json.dumps({"subject": "org-1", "limit": "api", "occurred_at": WEEK_DATE}).encode()
    with pytest.raises(ApiProblem) as raised:
        parse_events(body, "json", datetime(2026, 11, 26, tzinfo=UTC), 10)
    assert raised.value.errors == [
        (
            "occurred_at",
            f"'{WEEK_DATE}' is not an RFC 3339 time like 2026-11-22T12:00:00Z "
            "(ISO week dates such as 2026-W48-4 are not accepted)",
        )
    ]


# -- a token bucket has no calendar window -------------------------------------------------


def test_a_calendar_token_bucket_is_refused_by_the_cli_and_in_files(
    run: Run, url: str, tmp_path: Path
) -> None:
    args = ["--max", "10", "--period", "10s", "--algorithm", "token_bucket"]
    line = assert_one_line_error(run("limits", "set", "api", *args, "--window", "calendar"))
    assert (
        line == "error: window: a token bucket has no windows; window calendar is for fixed_window"
    )
    path = tmp_path / "limits.toml"
    path.write_text(
        '[api]\nmaximum = 10\nperiod = "10s"\nalgorithm = "token_bucket"\nwindow = "calendar"\n'
    )
    assert_one_line_error(run("limits", "load", str(path)), "a token bucket has no windows")
    with Meter(url) as meter:
        assert meter.list_limits() == []


def test_a_calendar_token_bucket_stored_before_the_rule_still_loads(url: str) -> None:
    with Meter(url) as meter:
        meter.set_limit(Limit("api", maximum=10, period="10s", algorithm="token_bucket"))
    database = url.removeprefix("sqlite:///")
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE limits SET window = 'calendar' WHERE name = 'api'")
    with Meter(url) as meter:
        assert meter.get_limit("api") == Limit(
            "api", maximum=10, period="10s", algorithm="token_bucket"
        )
        assert meter.consume("org-1", "api").allowed


# -- did you mean, every bad entry, whole summaries ----------------------------------


def test_limits_load_reports_every_bad_entry(run: Run, url: str, tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(
        "limits:\n"
        "  a: {maximum: 0, period: 1h}\n"
        "  b: {maximum: 5, period: 2x}\n"
        "  c: {maximum: 5, period: 1h}\n"
        "  d: 7\n"
    )
    line = assert_one_line_error(run("limits", "load", str(path)), "3 bad entries")
    for entry in ("limit a: maximum", "limit b: period", "limit d is not a mapping"):
        assert entry in line
    with Meter(url) as meter:
        assert meter.list_limits() == []


def test_help_groups_the_commands_and_cuts_no_summary(run: Run) -> None:
    from metering.cli import COMMANDS, SECTIONS

    listed = [name for commands in SECTIONS.values() for name in commands]
    assert sorted(listed) == sorted(COMMANDS)  # each command in exactly one section
    shown = run("--help").output
    for title in SECTIONS:
        assert f"\n{title}:\n" in shown
    groups = [name for name in COMMANDS if "Commands:" in run(name, "--help").output]
    assert len(groups) >= 10
    for page in [shown, *(run(name, "--help").output for name in groups)]:
        cut = [line for line in page.splitlines() if line.endswith("...") and "Usage:" not in line]
        assert not cut, page


def test_serve_on_a_busy_port_is_one_error_line(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    # serve exports its database and broker to its processes' environment:
    # undone after the test, so the rest of this process is not pointed at them
    # (monkeypatch records a variable it sets, not one it finds absent).
    for name in ("METERING_DATABASE_URL", "METERING_BROKER_URL"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--port", str(port))
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}: the port is in use")
