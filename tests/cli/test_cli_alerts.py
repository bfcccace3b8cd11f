"""``metering alerts set|list|remove`` (`metering/cli/alerts.py`), through
click's CliRunner on a SQLite file: a subject's own thresholds set, listed
(table and JSON) and removed; every bad input is one ``error:`` line on
stderr, exit 1, and no alert changes."""

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
    """A migrated SQLite file (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    """``metering --database URL ARGS...``, with api_calls (calendar month)."""
    runner = CliRunner()

    def invoke(*args: str, code: int | None = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    invoke("limits", "set", "api_calls", "--max", "5", "--period", "1mo", "--window", "calendar")
    return invoke


def alerts(url: str) -> list[Any]:
    with Meter(url) as meter:
        return [a.to_dict() for a in meter.alerts()]


def test_alerts_set_list_and_remove(run: Run) -> None:
    out = run("alerts", "set", "org", "api_calls", "--at", "80%", "--at", "4").output
    assert out == "set org api_calls: thresholds at 80%, 4\n"
    assert "org" in run("alerts", "list").output
    [alert] = json.loads(run("alerts", "list", "--format", "json").output)
    assert (alert["thresholds"], alert["thresholds_units"]) == ([80], [4])
    assert run("alerts", "remove", "org", "api_calls").output.startswith("removed org api_calls")
    assert "nothing changed" in run("alerts", "remove", "org", "api_calls").output
    assert run("alerts", "list").output == "no alerts\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["alerts", "set", "org", "api_calls", "--at", "eighty"], ["at"]),
        (["alerts", "set", "org", "api_calls", "--at", "0%"], ["at"]),
        (["alerts", "set", "org", "api_calls"], ["--at"]),
        (["alerts", "set", "org", "nope", "--at", "80%"], ["nope"]),
    ],
)
def test_bad_input_gives_one_error_line_and_changes_no_alert(
    run: Run, url: str, args: list[str], words: list[str]
) -> None:
    run("alerts", "set", "org", "api_calls", "--at", "50%")
    before = alerts(url)
    result = run(*args, code=None)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and all(word in line for word in words), line
    assert alerts(url) == before
