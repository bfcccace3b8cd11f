"""``metering reserve`` and ``metering reservations``, on a SQLite file."""

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

    def invoke(*args: str, code: int | None = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    invoke("limits", "set", "bad_login", "--max", "2", "--period", "1h")
    return invoke


def one_line_error(result: Result, text: str) -> None:
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: ") and text in result.stderr


def used(url: str) -> int:
    with Meter(url) as meter:
        return sum(c.used for c in meter.counters("10.0.0.7", "bad_login"))


def test_reserve_list_cancel_commit(run: Run, url: str) -> None:
    held = run("reserve", "10.0.0.7", "bad_login", "--event-id", "r1", "--ttl", "30")
    assert held.stdout == "r1\n"  # just the id, for scripts (README)
    assert held.stderr.startswith("reservation r1 held until ")
    assert "used 1/2" in held.stderr
    second = json.loads(run("reserve", "10.0.0.7", "bad_login", "--format", "json").output)
    assert second["reservation"] == "held" and second["allowed"] is True
    denied = run("reserve", "10.0.0.7", "bad_login", code=2)
    assert "denied" in denied.output and "held until" not in denied.output
    assert denied.stdout == ""
    listed = json.loads(run("reservations", "list", "--format", "json").output)
    assert [r["state"] for r in listed] == ["held", "held"]
    assert listed[1]["id"] == "r1" and listed[1]["charges"][0]["cost"] == 1
    assert "r1" in run("reservations", "list", "--state", "held").output

    assert run("reservations", "cancel", "r1").output == "cancelled r1: 1 given back\n"
    assert run("reservations", "cancel", "r1").output == "cancelled r1: 0 given back\n"
    assert used(url) == 1
    run("reservations", "commit", second["event_id"])
    one_line_error(run("reservations", "cancel", second["event_id"], code=None), "committed")
    one_line_error(run("reservations", "commit", "r1", code=None), "cancelled")
    assert used(url) == 1
    swept = run("reservations", "sweep", "--retention", "0").output
    # The cancelled r1 stays as long as its result (a void must see the cancel).
    assert swept == "committed 0, released 0, deleted 1\n"


def test_bad_input_is_one_line_and_changes_nothing(run: Run, url: str) -> None:
    run("reserve", "10.0.0.7", "bad_login")
    one_line_error(run("reservations", "cancel", "nope", code=None), "no reservation 'nope'")
    one_line_error(run("reserve", "10.0.0.7", "bad_login", "--ttl", "0", code=None), "ttl")
    one_line_error(run("reserve", "10.0.0.7", "unknown", code=None), "unknown limit")
    one_line_error(run("reserve", "10.0.0.7", "bad_login", "--cost", "0", code=None), "cost")
    one_line_error(run("reservations", "list", "--state", "lost", code=None), "--state")
    assert used(url) == 1


def test_list_takes_a_row_count_as_last_and_limit_still_works_with_a_warning(run: Run) -> None:
    run("reserve", "10.0.0.7", "bad_login", "--event-id", "first")
    run("reserve", "10.0.0.7", "bad_login", "--event-id", "second")
    newest = json.loads(run("reservations", "list", "--last", "1", "--format", "json").stdout)
    assert [r["id"] for r in newest] == ["second"]
    old = run("reservations", "list", "--limit", "1", "--format", "json")
    assert [r["id"] for r in json.loads(old.stdout)] == ["second"]
    assert old.stderr == "warning: --limit is deprecated here: use --last (a row count)\n"
    one_line_error(run("reservations", "list", "--last", "0", code=None), "--last")
    one_line_error(run("reservations", "list", "--last", "1", "--limit", "1", code=None), "--last")
    helped = run("reservations", "list", "--help").stdout
    assert "--last INTEGER" in helped and "--limit INTEGER" not in helped
    assert "--limit N, the old name of --last N" in helped


def test_commit_with_the_actual_amount_gives_the_rest_back(run: Run, url: str) -> None:
    run("reserve", "10.0.0.7", "bad_login", "--cost", "2", "--event-id", "r9")
    too_much = str(10**12 + 1)
    one_line_error(run("reservations", "commit", "r9", "--actual", too_much, code=None), "actual")
    one_line_error(run("reservations", "commit", "r9", "--actual", "-1", code=None), "actual")
    assert used(url) == 2
    done = run("reservations", "commit", "r9", "--actual", "1")
    assert done.output == "committed r9: 1 given back\n"
    assert used(url) == 1
    [listed] = json.loads(run("reservations", "list", "--format", "json").output)
    assert listed["charges"][0]["given_back"] == 1


def test_commit_of_more_than_reserved_charges_the_excess(run: Run, url: str) -> None:
    run("reserve", "10.0.0.7", "bad_login", "--cost", "2", "--event-id", "r9")
    done = run("reservations", "commit", "r9", "--actual", "7")
    assert (
        done.output == "committed r9: 0 given back, 5 overdraft (usage past a hard limit, billed)\n"
    )
    assert used(url) == 7
