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
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from functools import lru_cache
from typing import IO, Any, Final

from metering.reports.dimensions import DIMENSION_COLUMNS, DimensionRow
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


# A report's CSV shape: its header, and its cells of one row.
Shape = tuple[Sequence[str], Callable[[Any], tuple[object, ...]]]
OVERAGE_SHAPE: Final[Shape] = (COLUMNS, csv_cells)
DIMENSION_SHAPE: Final[Shape] = (DIMENSION_COLUMNS, dimension_cells)


def write_csv(rows: Iterable[Any], out: IO[str], shape: Shape = OVERAGE_SHAPE) -> None:
    """RFC 4180 CSV with a header of `COLUMNS`; instants in ISO 8601, none as empty;
    string cells neutralised (see the module docstring). ``shape`` is another
    report's header and cells (`DIMENSION_SHAPE`)."""
    columns, cells = shape
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(cells(row))


class _Line:
    """A file whose ``write`` hands the text back: `csv.writer.writerow` returns it."""

    def write(self, text: str) -> str:
        return text


def csv_lines(rows: Iterable[Any], shape: Shape = OVERAGE_SHAPE) -> Iterator[str]:
    """`write_csv`'s output line by line (the header first), as ``rows`` arrive:
    for a caller that streams it (the HTTP API) rather than writing to a file."""
    columns, cells = shape
    writer = csv.writer(_Line())
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow(cells(row))
