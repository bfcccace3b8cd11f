"""``metering checkout``, ``checkout renew|list``, ``checkin`` and ``limits set
--algorithm concurrent``, on a SQLite file: scripts get the id on stdout, a
denial exits 2, bad input is one ``error:`` line, exit 1, nothing stored."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result

from metering import FrozenClock, Limit, Meter
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

    made = invoke("limits", "set", "cad", "--max", "2", "--algorithm", "concurrent")
    assert made.stdout == "cad: max 2 held at once, concurrent, hard\n"
    invoke("limits", "set", "calls", "--max", "5", "--period", "1h")
    return invoke


def one_line_error(result: Result, text: str) -> None:
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: ") and text in result.stderr


def test_checkout_checkin_renew_list(run: Run) -> None:
    first = run("checkout", "alice", "cad", "--ttl", "15m").stdout.strip()
    assert first.startswith("co_")
    second = run("checkout", "new", "alice", "cad", "--id", "job-2", "--ttl", "1h")
    assert second.stdout == "job-2\n" and "(2 of 2 held)" in second.stderr
    denied = run("checkout", "alice", "cad", code=2)
    assert denied.stdout == "" and denied.stderr.startswith("denied: 2 of 2 held; retry at ")
    renewed = run("checkout", "renew", first, "--ttl", "2h")
    assert renewed.stdout.startswith(f"renewed {first} until ")
    assert run("checkin", first).stdout == f"checked in {first}: 1 given back\n"
    assert run("checkin", first).stdout == f"{first} was already checked in: nothing given back\n"
    listed = json.loads(run("checkout", "list", "--format", "json").stdout)
    assert [(c["id"], c["state"]) for c in listed] == [("job-2", "held"), (first, "released")]
    held = json.loads(run("checkout", "alice", "cad", "--format", "json").stdout)
    assert (held["state"], held["held"], held["maximum"]) == ("held", 2, 2)
    assert "released 0" in run("reservations", "sweep").stdout


def _expired(url: str) -> None:
    """In ``url``: ``job-77`` expired an hour ago; ``kept`` (older) held for a day."""
    clock = FrozenClock(datetime.now(UTC) - timedelta(hours=2))
    with Meter(url, clock=clock) as meter:
        meter.set_limit(Limit("cad", maximum=2, algorithm="concurrent"))
        meter.checkout("alice", "cad", checkout_id="kept", ttl_seconds=86_400)
        clock.advance(seconds=1)
        meter.checkout("alice", "cad", checkout_id="job-77", ttl_seconds=60)


def test_a_retry_of_an_expired_checkout_is_one_error_line(run: Run, url: str) -> None:
    _expired(url)
    assert run("checkout", "alice", "cad", "--id", "kept").stdout == "kept\n"  # held: the same
    ended = run("checkout", "alice", "cad", "--id", "job-77", code=None)
    one_line_error(ended, "checkout 'job-77' has ended: it expired at ")
    assert ended.stdout == ""
    with Meter(url) as meter:
        assert [c.id for c in meter.checkouts()] == ["job-77", "kept"]


def test_list_by_state_applies_expiry_first(db_url: str) -> None:
    _expired(db_url)
    runner = CliRunner()

    def listed(*args: str) -> list[tuple[str, str]]:
        result = runner.invoke(main, ["--database", db_url, "checkout", "list", *args])
        assert result.exit_code == 0, result.output
        return [(c["id"], c["state"]) for c in json.loads(result.stdout)]

    assert listed("--state", "released", "--format", "json") == [("job-77", "released")]
    assert listed("--state", "held", "--last", "1", "--format", "json") == [("kept", "held")]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("checkout", "alice", "calls"), "'calls' is fixed_window"),
        (("checkout", "alice", "nope"), "nope"),
        (("checkout", "alice", "cad", "--cost", "0"), "cost"),
        (("checkout", "alice", "cad", "--ttl", "1mo"), "ttl"),
        (("checkout", "alice", "cad", "--ttl", "soon"), "ttl"),
        (("checkin", "nope"), "no checkout 'nope'"),
        (("checkout", "renew", "nope"), "no checkout 'nope'"),
        (("consume", "alice", "cad"), "check a license out"),
        (
            ("limits", "set", "x", "--max", "2", "--algorithm", "concurrent", "--period", "1h"),
            "has no period",
        ),
        (("limits", "set", "x", "--max", "2"), "--period is required"),
    ],
)
def test_bad_input_is_one_error_line_and_changes_nothing(
    run: Run, url: str, args: tuple[str, ...], text: str
) -> None:
    one_line_error(run(*args, code=None), text)
    with Meter(url) as meter:
        assert meter.checkouts() == [] and meter.count_results() == 0
        assert [limit.name for limit in meter.list_limits()] == ["cad", "calls"]
