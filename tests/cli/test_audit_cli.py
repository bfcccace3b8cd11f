"""``metering audit`` through click's CliRunner on a SQLite file: exit 0 and
an all-zero table on a clean ledger; one line per violation and exit 1 on a
corrupted one; ``--format json``; a bad ``--since`` is one error line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import update

from metering import Limit, Meter
from metering.cli import main
from metering.storage.tables import counters, grants


@pytest.fixture
def url(sqlite_url: str) -> str:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1mo", window="calendar"))
        meter.consume("org-1", "calls", 3)
        meter.grant("org-2", "calls", 5, grant_id="bonus")
        meter.consume("org-2", "calls", 12)  # 10 of its own, 2 of the grant
    return sqlite_url


def run(url: str, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, ["--database", url, "audit", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def test_a_clean_ledger_exits_0(url: str) -> None:
    result = run(url)
    assert "2 windows checked (every window" in result.output
    assert "counter_ledger" in result.output  # the table names every invariant
    assert result.output.rstrip().endswith("ok: the ledger proves itself")


def test_each_violation_is_one_line_and_the_exit_is_1(url: str) -> None:
    with Meter(url) as meter, meter.database.engine.begin() as connection:
        connection.execute(update(counters).where(counters.c.subject == "org-1").values(used=7))
        connection.execute(update(grants).values(amount=1, used=1))  # 2 drawn
    result = run(url, "--full", code=1)
    lines = result.output.splitlines()
    assert lines[0].startswith("counter_ledger  org-1 calls  window 2026-")
    assert lines[0].endswith("expected used 3, found used 7")
    assert lines[1].startswith("grant_balance  org-2 calls  bonus  expected ")
    assert lines[2].startswith("2 windows checked")
    assert lines[-1] == "2 violations"
    found = json.loads(run(url, "--full", "--format", "json", code=1).output)
    assert found["counts"]["counter_ledger"] == 1
    assert [v["invariant"] for v in found["violations"]] == ["counter_ledger", "grant_balance"]


def test_since_checks_what_was_touched_since(url: str) -> None:
    result = run(url, "--since", "1h")
    assert "windows touched since" in result.output


def test_a_bad_since_is_one_error_line(url: str) -> None:
    result = run(url, "--since", "yesterday", code=1)
    [line] = result.output.splitlines()
    assert line.startswith("error: Invalid value for '--since'")
