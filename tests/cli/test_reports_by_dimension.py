"""``metering limits set --dimension`` and ``metering report usage --group-by`` through
click's CliRunner: output in every format, and bad input as one-line errors."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner, Result

from metering import FrozenClock, Meter
from metering.cli import main

NOW = datetime(2026, 11, 3, 10, 15, tzinfo=UTC)


def cli(url: str, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, ["--database", url, *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


@pytest.fixture
def url(sqlite_url: str) -> Iterator[str]:
    """A SQLite ledger: ``api`` records route and model; ``plain`` records nothing."""
    url = sqlite_url
    cli(
        url,
        "limits",
        "set",
        "api",
        "--max",
        "5",
        "--period",
        "1h",
        "--dimension",
        "route",
        "--dimension",
        "model",
    )
    cli(url, "limits", "set", "plain", "--max", "5", "--period", "1h")
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        for n in range(7):  # the last two are denied: nothing consumed
            metadata = {"route": f"/r{n % 2}", "model": 3} if n % 3 else None
            meter.consume("org-1", "api", metadata=metadata)
    yield url


def test_limits_set_records_dimensions(url: str) -> None:
    listed = json.loads(cli(url, "limits", "list", "--format", "json").stdout)
    assert [(d["name"], d["dimensions"]) for d in listed] == [
        ("api", ["route", "model"]),
        ("plain", []),
    ]
    assert "route, model" in cli(url, "limits", "list").stdout


def test_group_by_in_every_format(url: str) -> None:
    table = cli(url, "report", "usage", "--subject", "org-1", "--group-by", "route").stdout
    assert "Usage of org-1 by route, all time" in table and "(none)" in table
    rows = list(
        csv.reader(
            io.StringIO(
                cli(
                    url,
                    "report",
                    "usage",
                    "--subject",
                    "org-1",
                    "--group-by",
                    "route",
                    "--format",
                    "csv",
                ).stdout
            )
        )
    )
    assert rows == [
        ["subject", "limit", "dimension", "value", "used", "events"],
        ["org-1", "api", "route", "", "2", "2"],
        ["org-1", "api", "route", "/r0", "2", "2"],
        ["org-1", "api", "route", "/r1", "1", "1"],
    ]
    as_json = json.loads(
        cli(
            url,
            "report",
            "usage",
            "--subject",
            "org-1",
            "--group-by",
            "model",
            "--period",
            "2026-11",
            "--format",
            "json",
        ).stdout
    )
    assert as_json == {
        "report": "usage_by",
        "subject": "org-1",
        "group_by": "model",
        "period": "2026-11",
        "since": "2026-11-01T00:00:00+00:00",
        "until": "2026-12-01T00:00:00+00:00",
        "rows": [
            {
                "subject": "org-1",
                "limit": "api",
                "dimension": "model",
                "value": "3",
                "used": 3,
                "events": 3,
            },
            {
                "subject": "org-1",
                "limit": "api",
                "dimension": "model",
                "value": None,
                "used": 2,
                "events": 2,
            },
        ],
    }
    empty = cli(url, "report", "usage", "--subject", "nobody", "--group-by", "route").stdout
    assert "no usage" in empty


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--group-by", "zone", "--limit", "api"),
            "group_by: limit api does not record dimension 'zone'; it records route, model",
        ),
        (("--group-by", "zone"), "no limit records dimension 'zone'"),
        (("--group-by", "route", "--limit", "plain"), "limit plain does not record dimension"),
        (("--group-by", "route", "--limit", "nope"), "unknown limit 'nope'"),
        (("--group-by", ""), "group_by: '' must be 1 to 64"),
        (("--group-by", "route", "--since", "2026-11-03T10:30"), "since: 2026-11-03T10:30"),
        (("--group-by", "route", "--until", "2026-11-03T10:00:01Z"), "is not on the hour"),
        (("--group-by", "route", "--period", "2026-13"), "period:"),
        (("--group-by", "route", "--chart", "x.png"), "not with --group-by"),
    ],
)
def test_bad_group_by_is_a_one_line_error(url: str, args: Any, message: str) -> None:
    result = cli(url, "report", "usage", "--subject", "org-1", *args, code=1)
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--dimension", "a b"), "dimensions: 'a b' must be 1 to 64 of a-z A-Z 0-9 _ . -"),
        (("--dimension", "x" * 65), "must be 1 to 64"),
        (tuple(a for k in "abcde" for a in ("--dimension", k)), "at most 4 keys"),
    ],
)
def test_bad_dimensions_are_one_line_errors(url: str, args: Any, message: str) -> None:
    result = cli(url, "limits", "set", "other", "--max", "5", "--period", "1h", *args, code=1)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    listed = json.loads(cli(url, "limits", "list", "--format", "json").stdout)
    assert [d["name"] for d in listed] == ["api", "plain"]  # nothing changed


def test_group_by_needs_a_subject(url: str) -> None:
    result = cli(url, "report", "usage", "--group-by", "route", code=1)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "--subject" in lines[0], result.stderr
