"""``metering limits set ... --distinct KEY``, ``--meta KEY=VALUE`` on consume
and check, and ``metering seats``, through click's CliRunner on a SQLite
file; bad input is one ``error:`` line, exit 1, nothing stored."""

from __future__ import annotations

import json
from collections.abc import Callable

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
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        assert result.exit_code == code, (result.output, result.exception)
        return result

    return invoke


SET_SEATS = ("limits", "set", "seats", "--max", "2", "--period", "1mo", "--window", "calendar")


def test_seats_through_the_command_line(run: Run, url: str) -> None:
    out = run(*SET_SEATS, "--distinct", "user").output
    assert "distinct user" in out
    first = json.loads(
        run("consume", "org-1", "seats", "--meta", "user=ann", "--format", "json").output
    )
    again = json.loads(
        run("consume", "org-1", "seats", "--meta", "user=ann", "--format", "json").output
    )
    assert [first["charges"][0]["cost"], again["charges"][0]["cost"]] == [1, 0]
    run("consume", "org-1", "seats", "--meta", "user=bob")
    run("consume", "org-1", "seats", "--meta", "user=cy", code=2)  # denied: a third seat
    run("check", "org-1", "seats", "--meta", "user=bob")  # held: allowed
    run("check", "org-1", "seats", "--meta", "user=dan", code=2)
    assert run("seats", "org-1", "seats").output.split() == ["ann", "bob"]
    assert json.loads(run("seats", "org-1", "seats", "--format", "json").output) == ["ann", "bob"]
    assert "distinct user" in run("limits", "list").output
    assert json.loads(run("limits", "list", "--format", "json").output)[0]["distinct"] == "user"
    with Meter(url) as meter:
        assert [c.used for c in meter.counters("org-1", "seats")] == [2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (
                "limits",
                "set",
                "b",
                "--max",
                "5",
                "--period",
                "10s",
                "--algorithm",
                "token_bucket",
                "--distinct",
                "user",
            ),
            "error: distinct: a token bucket has no windows to count distinct values in",
        ),
        ((*SET_SEATS, "--distinct", "a b"), "error: distinct: 'a b' must be 1 to 64"),
        (("consume", "org-1", "seats"), "error: metadata: limit 'seats' counts distinct values"),
        (("consume", "org-1", "seats", "--meta", "team=x"), "must carry it"),
        (("consume", "org-1", "seats", "--meta", "user=a", "--cost", "3"), "cost must be 1"),
        (("check", "org-1", "seats"), "must carry it"),
        (("consume", "org-1", "seats", "--meta", "user"), "'user' is not KEY=VALUE"),
        (("seats", "org-1", "nope"), "error: unknown limit"),
    ],
)
def test_bad_seat_input_is_one_error_line_and_stores_nothing(
    run: Run, url: str, args: tuple[str, ...], message: str
) -> None:
    run(*SET_SEATS, "--distinct", "user")
    run("consume", "org-1", "seats", "--meta", "user=ann")
    result = run(*args, code=1)
    lines = result.output.strip().splitlines()
    assert message in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("error:")
    with Meter(url) as meter:
        assert [c.used for c in meter.counters("org-1", "seats")] == [1]
        assert meter.count_results() == 1
        assert [limit.name for limit in meter.list_limits()] == ["seats"]
