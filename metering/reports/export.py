"""Report rows as CSV, safe to open in a spreadsheet.

A cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return is a formula to Excel, LibreOffice and Google Sheets (CSV injection);
a subject such as ``=HYPERLINK(...)`` would run when an operator opens the
export. Following OWASP, such a *string* cell is written with a leading
single quote, which spreadsheets show as text. Numeric columns are written as
numbers and never touched, so a negative number stays a number. JSON output
keeps every value as it is.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import lru_cache
from typing import IO, Final

from metering.reports.overage import COLUMNS, ReportRow

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
        row.overage,
        row.denied_events,
        row.denied_cost,
        row.utilisation_percent,
        "" if first is None else first.isoformat(),
    )


def write_csv(rows: Iterable[ReportRow], out: IO[str]) -> None:
    """RFC 4180 CSV with a header of `COLUMNS`; instants in ISO 8601, none as empty;
    string cells neutralised (see the module docstring)."""
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(csv_cells(row))


class _Line:
    """A file whose ``write`` hands the text back: `csv.writer.writerow` returns it."""

    def write(self, text: str) -> str:
        return text


def csv_lines(rows: Iterable[ReportRow]) -> Iterator[str]:
    """`write_csv`'s output line by line (the header first), as ``rows`` arrive:
    for a caller that streams it (the HTTP API) rather than writing to a file."""
    writer = csv.writer(_Line())
    yield writer.writerow(COLUMNS)
    for row in rows:
        yield writer.writerow(csv_cells(row))
