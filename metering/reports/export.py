"""Reports as CSV, safe to open in a spreadsheet, and as JSON documents.

JSON is one object, the same for the command line and the HTTP API (`json_lines`): the
report's head (``report``, ``period``, ``since``, ``until`` and what else names it) and its
``rows``, every value as it is. In CSV, a *string* cell starting with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return (a formula to spreadsheets: CSV injection) is written with
a leading single quote, as OWASP advises; numeric columns are numbers and never touched.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from functools import lru_cache
from typing import IO, Any, Final

from metering.reports import dimensions
from metering.reports.dimensions import DIMENSION_COLUMNS, DimensionReport, DimensionRow
from metering.reports.overage import COLUMNS, BaseReport, ReportRange, ReportRow
from metering.reports.shadow import SHADOW_COLUMNS, ShadowRow

FORMULA_STARTS: Final = ("=", "+", "-", "@", "\t", "\r")


def neutralise(text: str) -> str:
    """``text`` with a leading ``'`` when a spreadsheet would read it as a formula."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


@lru_cache(maxsize=4096)
def _iso(moment: datetime) -> str:
    return moment.isoformat()


def csv_cells(row: ReportRow) -> tuple[object, ...]:
    """One row's cells as `write_csv` writes them: instants in ISO 8601, none as
    empty, string cells neutralised, numbers as numbers."""
    first = row.first_denied_at
    return (
        neutralise(row.subject),
        neutralise(row.limit),
        neutralise(row.enforcement),
        _iso(row.window_start),
        _iso(row.window_end),
        row.maximum,
        row.used,
        row.granted,
        row.overage,
        row.overdraft,
        row.denied,
        row.denied_events,
        row.utilisation_percent,
        "" if first is None else first.isoformat(),
        neutralise(row.time_zone or ""),
        neutralise(row.local_window or ""),
    )


def dimension_cells(row: DimensionRow) -> tuple[object, ...]:
    """A group-by row's cells: no value as empty, strings neutralised."""
    value = "" if row.value is None else neutralise(row.value)
    return (
        neutralise(row.subject),
        neutralise(row.limit),
        row.dimension,
        value,
        row.used,
        row.events,
    )


def shadow_cells(row: ShadowRow) -> tuple[object, ...]:
    """One shadow report row's cells, written as `csv_cells` writes a report row's."""
    first = row.first_would_deny_at
    return (
        neutralise(row.subject),
        neutralise(row.limit),
        row.would_deny_events,
        row.would_deny_cost,
        row.windows,
        "" if first is None else first.isoformat(),
        _iso(row.peak_window_start),
        _iso(row.peak_window_end),
        row.peak_used,
        row.peak_maximum,
        row.peak_would_deny_cost,
    )


# A report's kind -> its CSV header and the cells of one of its rows.
CsvFormat = tuple[Sequence[str], Callable[[Any], tuple[object, ...]]]
FORMATS: Final[dict[str, CsvFormat]] = {
    "overage": (COLUMNS, csv_cells),
    "usage": (COLUMNS, csv_cells),
    "shadow": (SHADOW_COLUMNS, shadow_cells),
    dimensions.KIND: (DIMENSION_COLUMNS, dimension_cells),
}


def write_csv(rows: Iterable[Any], out: IO[str], kind: str = "overage") -> None:
    """RFC 4180 CSV of a report of ``kind`` (the header of `COLUMNS` for
    overage and usage, `SHADOW_COLUMNS` for shadow, `DIMENSION_COLUMNS` for
    usage by dimension); instants in ISO 8601,
    none as empty; string cells neutralised (see the module docstring)."""
    columns, cells = FORMATS[kind]
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(cells(row))


class _Line:
    """A file whose ``write`` hands the text back: `csv.writer.writerow` returns it."""

    def write(self, text: str) -> str:
        return text


def csv_lines(rows: Iterable[Any], kind: str = "overage") -> Iterator[str]:
    """`write_csv`'s output line by line (the header first), as ``rows`` arrive:
    for a caller that streams it (the HTTP API) rather than writing to a file."""
    columns, cells = FORMATS[kind]
    writer = csv.writer(_Line())
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow(cells(row))


# -- JSON ---------------------------------------------------------------------------


def _range_head(chosen: ReportRange) -> dict[str, Any]:
    return {
        "period": chosen.label,
        "since": None if chosen.since is None else chosen.since.isoformat(),
        "until": None if chosen.until is None else chosen.until.isoformat(),
    }


def report_head(report: BaseReport[Any] | DimensionReport) -> dict[str, Any]:
    """A report's JSON fields before its rows: its kind and range, and for a
    shadow report its limit, for a group-by report its subject and key."""
    if isinstance(report, DimensionReport):
        return {
            "report": report.kind,
            "subject": report.query.subject,
            "group_by": report.dimension,
            **_range_head(report.range),
        }
    head: dict[str, Any] = {"report": report.kind, **_range_head(report.range)}
    if report.kind == "shadow":
        head["limit"] = report.query.limit
    return head


def json_lines(report: BaseReport[Any] | DimensionReport, rows: Iterable[Any]) -> Iterator[str]:
    """The report as one JSON object, ``{"report": ..., "rows": [...]}``, in
    pieces as ``rows`` arrive (a row a line): what ``metering report
    --format json`` prints and what the HTTP API answers."""
    head = json.dumps(report_head(report))
    yield head[:-1] + ', "rows": ['
    separator = "\n"
    for row in rows:
        yield separator + json.dumps(row.to_dict())
        separator = ",\n"
    yield "]}\n" if separator == "\n" else "\n]}\n"


def write_json(
    report: BaseReport[Any] | DimensionReport, rows: Iterable[Any], out: IO[str]
) -> None:
    """`json_lines` written to ``out``."""
    for piece in json_lines(report, rows):
        out.write(piece)
