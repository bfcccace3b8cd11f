"""`metering report overage|usage` through click's CliRunner, on the recorded dataset."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from click.testing import CliRunner, Result
from report_dataset import EVENTS

from metering import FrozenClock, Limit, Meter
from metering.cli import main, tables
from metering.reports import (
    COLUMNS,
    ReportRow,
    json_lines,
    overage_report,
    select_overage,
    select_shadow,
    select_usage,
    usage_report,
)

# The documented JSON fields and their types (README, "Billing period close").
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "subject": (str,),
    "limit": (str,),
    "enforcement": (str,),
    "window_start": (str,),
    "window_end": (str,),
    "maximum": (int,),
    "used": (int,),
    "granted": (int,),
    "overage": (int,),
    "overdraft": (int,),
    "denied": (int,),
    "denied_events": (int,),
    "utilisation_percent": (float,),
    "first_denied_at": (str, type(None)),
    "time_zone": (str, type(None)),
    "local_window": (str, type(None)),
}
INSTANTS = ("window_start", "window_end", "first_denied_at")


def run(ledger: Meter, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, ["--database", ledger.url, "report", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def as_strings(row: ReportRow) -> list[str]:
    values: list[str] = []
    for name in COLUMNS:
        value = getattr(row, name)
        values.append(
            ""
            if value is None
            else value.isoformat()
            if isinstance(value, datetime)
            else str(value)
        )
    return values


def test_overage_csv_parses_back_to_the_reports_rows(sqlite_ledger: Meter) -> None:
    result = run(sqlite_ledger, "overage", "--period", "2026-11", "--format", "csv")
    header, *rows = list(csv.reader(io.StringIO(result.stdout)))
    assert tuple(header) == COLUMNS
    expected = overage_report(sqlite_ledger, period="2026-11")
    assert rows == [as_strings(row) for row in expected]
    parsed = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [int(r["overage"]) for r in parsed] == [row.overage for row in expected]
    assert [datetime.fromisoformat(r["window_start"]) for r in parsed] == [
        row.window_start for row in expected
    ]


def test_overage_json_has_the_documented_fields_and_types(sqlite_ledger: Meter) -> None:
    result = run(sqlite_ledger, "overage", "--period", "2026-11", "--format", "json")
    document = json.loads(result.stdout)
    expected = overage_report(sqlite_ledger, period="2026-11")
    # The HTTP API's shape: the report's head, then its rows.
    assert document == {
        "report": "overage",
        "period": "2026-11",
        "since": "2026-11-01T00:00:00+00:00",
        "until": "2026-12-01T00:00:00+00:00",
        "rows": document["rows"],
    }
    rows = document["rows"]
    assert len(rows) == len(expected) > 0
    for item, row in zip(rows, expected, strict=True):
        assert list(item) == list(JSON_TYPES)
        for name, value in item.items():
            assert isinstance(value, JSON_TYPES[name]) and not isinstance(value, bool), name
        for name in INSTANTS:
            if item[name] is not None:
                assert datetime.fromisoformat(item[name]).utcoffset() is not None
        assert item["enforcement"] in ("hard", "soft")
        assert item == row.to_dict()
    assert any(item["first_denied_at"] is not None for item in rows)


JSON_REPORTS: dict[str, tuple[tuple[str, ...], Callable[[Meter], Any]]] = {
    "overage": (
        ("overage", "--period", "2026-11"),
        lambda m: select_overage(m, period="2026-11"),
    ),
    "overage filtered": (
        ("overage", "--since", "2026-11-10", "--subject", "org-a", "--top", "3"),
        lambda m: select_overage(m, since="2026-11-10", subject="org-a", top=3),
    ),
    "usage": (
        ("usage", "--subject", "org-a", "--until", "2026-12-01"),
        lambda m: select_usage(m, "org-a", until="2026-12-01"),
    ),
    "shadow": (("shadow", "--limit", "exports"), lambda m: select_shadow(m, "exports")),
}


@pytest.mark.parametrize("case", list(JSON_REPORTS))
def test_cli_json_is_the_http_apis_document(sqlite_ledger: Meter, case: str) -> None:
    """``--format json`` prints what ``GET /v1/reports/...`` answers, the
    report's head and its rows: one writer (`json_lines`) for both."""
    args, select = JSON_REPORTS[case]
    if case == "shadow":
        # Shadow from the first event on: a report takes a window's enforcement at its end.
        clock = sqlite_ledger.clock
        assert isinstance(clock, FrozenClock)
        clock.set(EVENTS[0][3])
        sqlite_ledger.set_limit(Limit("exports", maximum=3, period="7d", enforcement="shadow"))
    printed = run(sqlite_ledger, *args, "--format", "json").stdout
    chosen = select(sqlite_ledger)
    assert printed == "".join(json_lines(chosen, chosen.rows()))
    document = json.loads(printed)
    assert document["report"] == args[0] and document["rows"]
    assert set(document) >= {"report", "period", "since", "until", "rows"}


def test_empty_json_and_csv(sqlite_ledger: Meter) -> None:
    empty = run(sqlite_ledger, "overage", "--period", "2020-01", "--format", "json").stdout
    assert json.loads(empty)["rows"] == []
    empty_csv = run(sqlite_ledger, "overage", "--period", "2020-01", "--format", "csv").stdout
    assert list(csv.reader(io.StringIO(empty_csv))) == [list(COLUMNS)]
    assert "no windows" in run(sqlite_ledger, "overage", "--period", "2020-01").stdout


def test_overage_table_with_filters(sqlite_ledger: Meter) -> None:
    out = run(sqlite_ledger, "overage", "--period", "2026-11", "--top", "2").stdout
    assert "Overage, 2026-11" in out
    top = overage_report(sqlite_ledger, period="2026-11", top=2)
    for row in top:
        assert row.subject in out and row.limit in out
    assert "org-c" not in out
    only_c = run(sqlite_ledger, "overage", "--subject", "org-c", "--limit", "seats").stdout
    assert "org-c" in only_c and "org-a" not in only_c


def test_since_until_and_progress_keep_the_csv_clean(sqlite_ledger: Meter) -> None:
    args = ("overage", "--since", "2026-11-10", "--until", "2026-11-20", "--format", "csv")
    result = run(sqlite_ledger, *args, "--progress")
    _, *rows = list(csv.reader(io.StringIO(result.stdout)))
    expected = overage_report(sqlite_ledger, since="2026-11-10", until="2026-11-20")
    assert rows == [as_strings(row) for row in expected]
    assert run(sqlite_ledger, *args, "--no-progress").stdout == result.stdout


def test_usage_csv_for_a_subject(sqlite_ledger: Meter) -> None:
    result = run(sqlite_ledger, "usage", "--subject", "org-a", "--format", "csv")
    _, *rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows == [as_strings(row) for row in usage_report(sqlite_ledger, "org-a")]
    table = run(sqlite_ledger, "usage", "--subject", "org-a", "--limit", "seats").stdout
    assert "Usage of org-a, all time" in table and "api_calls" not in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("overage", "--limit", "nope"), "unknown limit 'nope'"),
        (("overage", "--period", "2026-13"), "period: '2026-13' is not a month"),
        (("overage", "--period", "11/2026"), "period:"),
        (("overage", "--since", "2026-12-01", "--until", "2026-11-01"), "is not before until"),
        (("overage", "--since", "soon"), "since:"),
        (("overage", "--top", "0"), "top: must be a whole number of at least 1"),
        (("overage", "--top", "many"), "'many' is not a valid integer"),
        (("overage", "--format", "xml"), "--format"),
        (("overage", "--period", "2026-11", "--until", "2026-12-01"), "not both"),
        (("usage",), "--subject"),
        (("usage", "--subject", "org-a", "--limit", "nope"), "unknown limit"),
    ],
)
def test_bad_filters_are_one_line_errors(sqlite_ledger: Meter, args: Any, message: str) -> None:
    result = run(sqlite_ledger, *args, code=1)
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert result.stdout == ""


def table_row(out: str, subject: str, limit: str) -> dict[str, str]:
    """One row of a printed table, by its header (rich's box characters split cells)."""
    lines = [line for line in out.splitlines() if "┃" in line or "│" in line]
    header = [cell.strip() for cell in lines[0].strip("┃").split("┃")]
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if cells[:2] == [subject, limit]:
            return dict(zip(header, cells, strict=True))
    raise AssertionError(f"no row for {subject} {limit} in\n{out}")


def test_a_hard_limits_denials_are_denied_not_overage_in_every_format(
    ledger: Meter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """org-a's seats (hard, maximum 5) denied 2 events of 1: nothing billable."""
    args = ("overage", "--period", "2026-11", "--subject", "org-a")
    [as_csv] = [
        r
        for r in csv.DictReader(io.StringIO(run(ledger, *args, "--format", "csv").stdout))
        if r["limit"] == "seats"
    ]
    assert (as_csv["used"], as_csv["overage"], as_csv["denied"], as_csv["denied_events"]) == (
        "5",
        "0",
        "2",
        "2",
    )
    rows = json.loads(run(ledger, *args, "--format", "json").stdout)["rows"]
    [as_json] = [r for r in rows if r["limit"] == "seats"]
    assert (as_json["overage"], as_json["denied"], as_json["denied_events"]) == (0, 2, 2)
    # The table as a terminal wide enough for its rules shows it (piped: plain text).
    monkeypatch.setattr(tables, "stdout_is_terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", "200")
    shown = table_row(run(ledger, *args).stdout, "org-a", "seats")
    assert (shown["overage"], shown["denied"], shown["denied events"]) == ("0", "2", "2")
    # A soft limit's overage is its usage beyond the maximum, and it denies nothing.
    calls = table_row(run(ledger, *args).stdout, "org-a", "api_calls")
    assert (calls["maximum"], calls["used"], calls["overage"], calls["denied"]) == (
        "10",
        "30",
        "20",
        "0",
    )
