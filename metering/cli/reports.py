"""``metering report overage|usage|shadow``: the reports on the command line.

``usage --group-by KEY`` is the usage-by-dimension report
(`metering.reports.dimensions`): a subject's usage per limit and value of a
metadata key its limits record.

CSV (neutralised against formula injection: `metering.reports.export`) and
JSON are written row by row as the database streams them, so a large export
keeps memory flat; a progress bar goes to stderr when it is a terminal (or
with ``--progress``).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from functools import wraps
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from metering.cli.context import SentenceGroup, current_meter
from metering.cli.options import FORMAT_OPTION, PROGRESS_OPTION, stacked
from metering.cli.output import money, spend_currencies, window_span
from metering.cli.tables import print_table, table
from metering.domain.instants import clock_text
from metering.domain.jsonable import field_names
from metering.domain.rollups import shown_value
from metering.errors import InvalidInput
from metering.limits.service import list_limits
from metering.reports import dimensions
from metering.reports.charts import DEFAULT_TOP, chart_format, overage_chart, usage_chart
from metering.reports.dimensions import (
    DIMENSION_COLUMNS,
    DimensionReport,
    DimensionRow,
    usage_by_dimension,
)
from metering.reports.export import FORMATS, write_csv, write_json
from metering.reports.overage import BaseReport, Report, ReportRow, select_overage, select_usage
from metering.reports.shadow import ShadowRow, select_shadow
from metering.reports.spend import spend_report

F = TypeVar("F", bound=Callable[..., Any])
RowT = TypeVar("RowT")

PROGRESS_EVERY: Final = 1000
# The columns shown as numbers (right-aligned, with thousands separators):
# the whole numbers and percentages of the overage, usage and shadow rows.
NUMERIC: Final = frozenset(
    f.name for row in (ReportRow, ShadowRow) for f in fields(row) if f.type in ("int", "float")
)
HEADERS: Final = {
    "window_start": "window start",
    "window_end": "window end",
    "denied_events": "denied events",
    "utilisation_percent": "used %",
    "window": "window (UTC)",
    "peak_window": "peak window (UTC)",
    "first_denied_at": "first denial",
    "would_deny_events": "would-deny events",
    "would_deny_cost": "would-deny cost",
    "first_would_deny_at": "first would-deny",
    "peak_window_start": "peak window",
    "peak_window_end": "peak ends",
    "peak_used": "peak used",
    "peak_maximum": "peak maximum",
    "peak_would_deny_cost": "peak would-deny",
}
# What a report's table shows, so that it fits 100 columns: a window in one
# cell (`window_span`); CSV and JSON carry every column (a row's enforcement
# and first denial too).
REPORT_TABLE: Final = (
    "subject",
    "limit",
    "window",
    "maximum",
    "used",
    "granted",
    "overage",
    "overdraft",
    "denied",
    "denied_events",
    "utilisation_percent",
)
TABLE_COLUMNS: Final = {
    "overage": REPORT_TABLE,
    "usage": REPORT_TABLE,
    "shadow": (
        "subject",
        "limit",
        "would_deny_events",
        "would_deny_cost",
        "windows",
        "peak_window",
        "peak_used",
        "peak_maximum",
        "peak_would_deny_cost",
    ),
}
# A spend limit's figures, shown in its currency (minor units in CSV and JSON).
MONEY: Final = frozenset(
    {"maximum", "used", "granted", "overage", "overdraft", "denied", "would_deny_cost"}
)
# The cells that show a window: its start and end.
SPANS: Final = {
    "window": ("window_start", "window_end"),
    "peak_window": ("peak_window_start", "peak_window_end"),
}


_period_options = stacked(
    click.option(
        "--period", "--month", "period", metavar="YYYY-MM", help="A calendar month (UTC)."
    ),
    click.option("--since", metavar="TIME", help="Windows starting at or after this (RFC 3339)."),
    click.option("--until", metavar="TIME", help="Windows starting before this."),
)


def _chart_path(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """Refuse a chart file whose suffix is not a chart format, before any output."""
    if value is not None:
        try:
            chart_format(value)
        except InvalidInput as exc:
            raise click.BadParameter(exc.message) from None
    return value


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """What `_filter_options` read: the period, the limit, the output format,
    the chart file and the progress bar."""

    period: str | None
    since: str | None
    until: str | None
    limit: str | None
    fmt: str
    chart: Path | None
    progress: bool | None

    @property
    def filters(self) -> dict[str, Any]:
        """The period and the limit, as the report functions take them."""
        return {
            "period": self.period,
            "since": self.since,
            "until": self.until,
            "limit": self.limit,
        }


def _filter_options(func: F) -> F:
    """The options of the overage and usage reports, passed to the command
    as one `ReportOptions`, ``options``."""

    @wraps(func)
    def command(**values: Any) -> Any:
        own = {name: values.pop(name) for name in field_names(ReportOptions)}
        return func(options=ReportOptions(**own), **values)

    return cast(
        F,
        stacked(
            _period_options,
            click.option("--limit", help="Only this limit."),
            FORMAT_OPTION,
            click.option(
                "--chart",
                type=click.Path(dir_okay=False, path_type=Path),
                callback=_chart_path,
                metavar="FILE.png",
                help="Also draw a chart: FILE.png, .svg or .pdf (the suffix picks the format).",
            ),
            PROGRESS_OPTION,
        )(command),
    )


@click.group(cls=SentenceGroup)
def report() -> None:
    """Billing reports: overage per window, a subject's usage over time,
    whom a shadow limit would have denied.

    A report selects the windows that start in the period (--period 2026-11,
    or --since/--until; --until is exclusive). Token buckets and counters of
    deleted limits are left out.
    """


@report.command()
@_filter_options
@click.option("--subject", help="Only this subject.")
@click.option("--top", type=int, metavar="N", help="Only the N rows with the largest overage.")
def overage(options: ReportOptions, subject: str | None, top: int | None) -> None:
    """Maximum, used, granted, overage and denials per subject, limit and
    window, by overage, then denied cost.

    The maximum is the one that applied to the subject in the window (its
    entitlement at the window's end, else the limit's default); granted is
    the usage grants paid. Overage is the billable usage beyond the maximum:
    a soft limit's own usage (used - granted) past it; 0 for hard and shadow
    limits. Denied is the cost of the denied events (demand refused, never
    billed; a shadow limit's would-denies: see report shadow). JSON is one
    object, {"report": ..., "rows": [...]}, as over HTTP.
    """
    chosen = select_overage(current_meter(), subject=subject, top=top, **options.filters)
    chart = options.chart
    keep = (top or DEFAULT_TOP) if chart is not None else 0
    kept = _output(chosen, options.fmt, options.progress, keep, _overage_title(chosen))
    if chart is not None:
        _chart_written(overage_chart(kept, chart, chosen.range.label))


@report.command()
@click.option("--subject", required=True, help="The subject.")
@_filter_options
@click.option(
    "--group-by",
    "group_by",
    metavar="KEY",
    help="Usage per value of this metadata key (one its limits record), largest first.",
)
def usage(subject: str, options: ReportOptions, group_by: str | None) -> None:
    """One subject's usage per window over time, limit by limit.

    With --group-by KEY: the subject's usage per limit and value of the
    event-metadata KEY (a limit records the keys of its dimensions), over
    hours starting in the period (--since/--until on the hour), the
    largest first. Events without the key count under (none).
    """
    chart = options.chart
    if group_by is not None:
        if chart is not None:
            raise InvalidInput("chart", "--chart draws usage per window; not with --group-by")
        grouped = usage_by_dimension(
            current_meter(), subject=subject, key=group_by, **options.filters
        )
        _output_groups(grouped, options.fmt, options.progress)
        return
    chosen = select_usage(current_meter(), subject, **options.filters)
    keep = None if chart is not None else 0
    title = f"Usage of {subject}, {chosen.range.label}"
    kept = _output(chosen, options.fmt, options.progress, keep, title)
    if chart is not None:
        _chart_written(usage_chart(kept, chart, subject, chosen.range.label))


@report.command()
@click.option("--limit", required=True, help="The shadow limit.")
@_period_options
@click.option("--subject", help="Only this subject.")
@FORMAT_OPTION
@click.option("--top", type=int, metavar="N", help="Only the N subjects with most would-deny cost.")
@PROGRESS_OPTION
def shadow(
    limit: str,
    period: str | None,
    since: str | None,
    until: str | None,
    subject: str | None,
    fmt: str,
    top: int | None,
    progress: bool | None,
) -> None:
    """Whom a shadow limit would have denied, had it been hard: per subject,
    the would-deny count and cost, in how many windows, and the peak window's
    usage against the maximum that applied; by would-deny cost."""
    chosen = select_shadow(
        current_meter(), limit, period=period, since=since, until=until, subject=subject, top=top
    )
    _output(chosen, fmt, progress, 0, f"Would deny ({limit}), {chosen.range.label}")


def print_overage(chosen: Report, keep: int) -> list[ReportRow]:
    """Print the overage report as a table, as ``metering report overage`` does;
    returns its first ``keep`` rows (the ones a chart shows)."""
    return _output(chosen, "table", False, keep, _overage_title(chosen))


def _overage_title(chosen: Report) -> str:
    return f"Overage, {chosen.range.label}"


def _chart_written(path: Path) -> None:
    click.echo(f"chart written to {path}", err=True)


# -- output ---------------------------------------------------------------------


def _output(
    chosen: BaseReport[RowT], fmt: str, progress: bool | None, keep: int | None, title: str
) -> list[RowT]:
    """Write the report on stdout; return its first ``keep`` rows (None: all)."""
    kept: list[RowT] = []

    def tee(rows: Iterable[RowT]) -> Iterator[RowT]:
        for row in rows:
            if keep is None or len(kept) < keep:
                kept.append(row)
            yield row

    show = sys.stderr.isatty() if progress is None else progress
    rows = _with_progress(chosen) if show else chosen.rows()
    out = sys.stdout
    if fmt == "csv":
        write_csv(tee(rows), out, chosen.kind)
    elif fmt == "json":
        write_json(chosen, tee(rows), out)
    else:
        currencies = spend_currencies(list_limits(chosen.database))
        _print_report(list(tee(rows)), chosen.kind, title, currencies)
    return kept


def _output_groups(grouped: DimensionReport, fmt: str, progress: bool | None) -> None:
    """Write a group-by report on stdout, as its rows stream in."""
    show = sys.stderr.isatty() if progress is None else progress
    rows = _with_progress(grouped) if show else grouped.rows()
    if fmt == "csv":
        write_csv(rows, sys.stdout, dimensions.KIND)
    elif fmt == "json":
        write_json(grouped, rows, sys.stdout)
    else:
        title = f"Usage of {grouped.query.subject} by {grouped.dimension}, {grouped.range.label}"
        _print_groups(list(rows), title)


def _print_groups(rows: list[DimensionRow], title: str) -> None:
    if not rows:
        click.echo(f"{title}: no usage")
        return
    cells = [
        [
            r.subject,
            r.limit,
            r.dimension,
            shown_value(r.value or ""),
            f"{r.used:,}",
            f"{r.events:,}",
        ]
        for r in rows
    ]
    print_table(table(DIMENSION_COLUMNS, cells, title, numeric={"used", "events"}))


def _with_progress(chosen: BaseReport[RowT] | DimensionReport) -> Iterator[Any]:
    total = chosen.count()
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(f"{chosen.kind} report", total=total)
        done = 0
        for row in chosen.rows():
            yield row
            done += 1
            if done % PROGRESS_EVERY == 0:
                bar.update(task, completed=done)
        bar.update(task, completed=done)


def _cell(name: str, value: object) -> object:
    if isinstance(value, datetime):
        return clock_text(value)
    if value is not None and name == "utilisation_percent":
        return f"{value:.1f}"
    if value is not None and name in NUMERIC:
        return f"{value:,}"
    return value


def _table_cell(row: Any, name: str, currencies: Mapping[str, str]) -> object:
    if name in SPANS:
        start, end = SPANS[name]
        span = window_span(getattr(row, start), getattr(row, end))
        local = getattr(row, "local_window", None)
        return span if local is None else f"{span} (local {local})"
    value = getattr(row, name)
    if name in MONEY and row.limit in currencies and isinstance(value, int):
        return money(value, row.limit, currencies)
    return _cell(name, value)


def _print_report(rows: list[Any], kind: str, title: str, currencies: Mapping[str, str]) -> None:
    if not rows:
        click.echo(f"{title}: no windows")
        return
    columns = TABLE_COLUMNS.get(kind, FORMATS[kind][0])
    headers = [HEADERS.get(name, name) for name in columns]
    numeric = {HEADERS.get(name, name) for name in NUMERIC}
    cells = [[_table_cell(row, name, currencies) for name in columns] for row in rows]
    print_table(table(headers, cells, title, numeric=numeric))


@report.command()
@click.option(
    "--period",
    "--month",
    "period",
    metavar="YYYY-MM",
    help="A calendar month (UTC). Default: all time, as the other reports.",
)
@click.option("--subject", help="Only this subject.")
@FORMAT_OPTION
def spend(period: str | None, subject: str | None, fmt: str) -> None:
    """Per subject and currency: the amount of each priced limit, the total,
    and the cap of each spend limit of the currency (the subject's
    entitlement at the month's end, or now for all time, else the limit's).
    Without --period, all time, as every report. Amounts in major units; each
    priced charge rounded half to even at the minor unit."""
    found = spend_report(current_meter(), period, subject)
    if fmt == "json":
        click.echo(json.dumps(found.to_dict(), indent=2))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(found.csv_header())
        writer.writerows(found.csv_rows())
    elif not found.rows:
        click.echo(f"no priced usage in {found.range.label}")
    else:
        header = found.csv_header()
        print_table(table(header, list(found.csv_rows()), title=f"Spend, {found.range.label}"))
