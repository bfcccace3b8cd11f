"""``metering grants add --every`` and ``grants recurring``, through click's
CliRunner on a SQLite file (``metering alerts``: test_cli_alerts.py).

Every bad input is one ``error:`` line on stderr, exit 1, and nothing stored
changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result

from metering import Meter
from metering.cli import main

Run = Callable[..., Result]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    """``metering --database URL ARGS...``, with api_calls (calendar month) and a bucket."""
    runner = CliRunner()

    def invoke(*args: str, code: int | None = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    invoke("limits", "set", "api_calls", "--max", "5", "--period", "1mo", "--window", "calendar")
    invoke(
        "limits", "set", "burst", "--max", "10", "--period", "10s", "--algorithm", "token_bucket"
    )
    return invoke


def snapshot(url: str) -> tuple[Any, ...]:
    with Meter(url) as meter:
        return (
            [g.to_dict() for g in meter.grants()],
            [r.to_dict() for r in meter.recurring_grants()],
        )


def assert_one_line_error(result: Result, *words: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_recurring_grant_is_added_and_listed(run: Run) -> None:
    out = run(
        "grants",
        "add",
        "org",
        "api_calls",
        "500",
        "--every",
        "1mo",
        "--rollover-max",
        "200",
        "--priority",
        "10",
        "--low",
        "20%",
        "--id",
        "monthly",
    ).output
    assert out.startswith("granted monthly: org api_calls 500 (0 used, 500 left)")
    assert "issue 1 of recurring grant monthly" in out
    listed = run("grants", "recurring").output
    assert listed.startswith("monthly: org api_calls 500 every 1mo, rollover up to 200, ")
    assert "priority 10, low at 20%, issue 2 at " in listed
    [found] = json.loads(run("grants", "recurring", "--format", "json").output)
    assert (found["every"], found["rollover_max"], found["last_issue"]) == ("1mo", 200, 1)
    [grant] = json.loads(run("grants", "list", "--format", "json").output)
    assert (grant["priority"], grant["low_at"], grant["recurring_grant_id"]) == (10, 100, "monthly")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["grants", "add", "org", "burst", "5", "--every", "1mo"], ["token bucket"]),
        (["grants", "add", "org", "api_calls", "5", "--rollover-max", "3"], ["rollover_max"]),
        (["grants", "add", "org", "api_calls", "-5", "--every", "1mo"], []),
        (["grants", "add", "org", "api_calls", "5", "--every", "monthly"], ["every"]),
        (
            ["grants", "add", "org", "api_calls", "5", "--every", "1mo", "--rollover-max", "-1"],
            ["rollover_max"],
        ),
        (["grants", "add", "org", "api_calls", "5", "--until", "2030-01-01"], ["until"]),
        (
            ["grants", "add", "org", "api_calls", "5", "--every", "1mo", "--expires", "2030-01-01"],
            ["expires_at"],
        ),
        (["grants", "add", "org", "api_calls", "5", "--priority", "-1"], ["priority"]),
        (["grants", "add", "org", "api_calls", "5", "--low", "200%"], ["low"]),
        (["grants", "add", "org", "nope", "5", "--every", "1mo"], ["nope"]),
    ],
)
def test_bad_input_gives_one_error_line_and_stores_nothing(
    run: Run, url: str, args: list[str], words: list[str]
) -> None:
    before = snapshot(url)
    assert_one_line_error(run(*args, code=None), *words)
    assert snapshot(url) == before
