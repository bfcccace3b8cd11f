"""``metering report overage|usage``: the reports on the command line.

``usage --group-by KEY`` is the usage-by-dimension report
(`metering.reports.dimensions`): a subject's usage per limit and value of a
metadata key its limits record.

CSV (neutralised against formula injection: `metering.reports.export`) and
JSON are written row by row as the database streams them, so a large export
keeps memory flat; a progress bar goes to stderr when it is a terminal (or
with ``--progress``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from metering.cli.context import current_meter
from metering.cli.output import print_table, table
from metering.domain.rollups import shown_value
from metering.errors import InvalidInput
from metering.reports.charts import DEFAULT_TOP, overage_chart, usage_chart
from metering.reports.dimensions import (
    DIMENSION_COLUMNS,
    DimensionReport,
    DimensionRow,
    usage_by_dimension,
)
from metering.reports.export import DIMENSION_SHAPE, write_csv
from metering.reports.overage import COLUMNS, Report, ReportRow, select_overage, select_usage

F = TypeVar("F", bound=Callable[..., Any])

PROGRESS_EVERY: Final = 1000
NUMERIC: Final = frozenset(
    {"maximum", "used", "overage", "denied_events", "denied_cost", "utilisation_percent"}
)
HEADERS: Final = {
    "window_start": "window start",
    "window_end": "window end",
    "denied_events": "denied events",
    "denied_cost": "denied cost",
    "utilisation_percent": "utilisation %",
    "first_denied_at": "first denial",
}


def _filter_options(func: F) -> F:
    decorators = [
        click.option("--period", metavar="YYYY-MM", help="A calendar month (UTC)."),
        click.option("--since", metavar="ISO8601", help="Windows starting at or after this."),
        click.option("--until", metavar="ISO8601", help="Windows starting before this."),
        click.option("--limit", help="Only this limit."),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(["table", "csv", "json"]),
            default="table",
            show_default=True,
            help="Output on stdout.",
        ),
        click.option(
            "--chart",
            type=click.Path(dir_okay=False, path_type=Path),
            metavar="FILE.png",
            help="Also draw a PNG chart.",
        ),
        click.option(
            "--progress/--no-progress",
            default=None,
            help="Progress bar on stderr (default: when stderr is a terminal).",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


@click.group()
def report() -> None:
    """Billing reports: overage per window, a subject's usage over time.

    A report selects the windows that start in the period (--period 2026-11,
    or --since/--until; --until is exclusive). Token buckets and counters of
    deleted limits are left out.
    """


@report.command()
@_filter_options
@click.option("--subject", help="Only this subject.")
@click.option("--top", type=int, metavar="N", help="Only the N rows with the largest overage.")
def overage(
    period: str | None,
    since: str | None,
    until: str | None,
    limit: str | None,
    fmt: str,
    chart: Path | None,
    progress: bool | None,
    subject: str | None,
    top: int | None,
) -> None:
    """Maximum, used, overage and denials per subject, limit and window, by overage.

    Overage is, for a soft limit, usage beyond the maximum; for a hard limit,
    the cost of the denied events.
    """
    chosen = select_overage(
        current_meter(),
        period=period,
        since=since,
        until=until,
        subject=subject,
        limit=limit,
        top=top,
    )
    keep = (top or DEFAULT_TOP) if chart is not None else 0
    kept = _output(chosen, fmt, progress, keep, f"Overage, {chosen.range.label}")
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
def usage(
    subject: str,
    period: str | None,
    since: str | None,
    until: str | None,
    limit: str | None,
    fmt: str,
    chart: Path | None,
    progress: bool | None,
    group_by: str | None,
) -> None:
    """One subject's usage per window over time, limit by limit.

    With --group-by KEY: the subject's usage per limit and value of the
    event-metadata KEY (a limit records the keys of its dimensions), over
    hours starting in the period (--since/--until on the hour), the
    largest first. Events without the key count under (none).
    """
    if group_by is not None:
        if chart is not None:
            raise InvalidInput("chart", "--chart draws usage per window; not with --group-by")
        grouped = usage_by_dimension(
            current_meter(),
            subject=subject,
            key=group_by,
            limit=limit,
            period=period,
            since=since,
            until=until,
        )
        _output_groups(grouped, fmt, progress)
        return
    chosen = select_usage(
        current_meter(), subject, period=period, since=since, until=until, limit=limit
    )
    keep = None if chart is not None else 0
    kept = _output(chosen, fmt, progress, keep, f"Usage of {subject}, {chosen.range.label}")
    if chart is not None:
        _chart_written(usage_chart(kept, chart, subject, chosen.range.label))


def _chart_written(path: Path) -> None:
    click.echo(f"chart written to {path}", err=True)


# -- output ---------------------------------------------------------------------


def _output(
    chosen: Report, fmt: str, progress: bool | None, keep: int | None, title: str
) -> list[ReportRow]:
    """Write the report on stdout; return its first ``keep`` rows (None: all)."""
    kept: list[ReportRow] = []

    def tee(rows: Iterable[ReportRow]) -> Iterator[ReportRow]:
        for row in rows:
            if keep is None or len(kept) < keep:
                kept.append(row)
            yield row

    show = sys.stderr.isatty() if progress is None else progress
    rows = _with_progress(chosen) if show else chosen.rows()
    out = sys.stdout
    if fmt == "csv":
        write_csv(tee(rows), out)
    elif fmt == "json":
        _write_json(tee(rows), out)
    else:
        _print_report(list(tee(rows)), title)
    return kept


def _output_groups(grouped: DimensionReport, fmt: str, progress: bool | None) -> None:
    """Write a group-by report on stdout, as its rows stream in."""
    show = sys.stderr.isatty() if progress is None else progress
    rows = _with_progress(grouped) if show else grouped.rows()
    if fmt == "csv":
        write_csv(rows, sys.stdout, DIMENSION_SHAPE)
    elif fmt == "json":
        _write_json(rows, sys.stdout)
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


def _with_progress(chosen: Report | DimensionReport) -> Iterator[Any]:
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


def _write_json(rows: Iterable[ReportRow | DimensionRow], out: IO[str]) -> None:
    """A JSON array, one object per line, written as rows arrive."""
    separator = "[\n"
    for row in rows:
        out.write(separator + "  " + json.dumps(row.to_dict()))
        separator = ",\n"
    out.write("[]\n" if separator == "[\n" else "\n]\n")


def _cell(name: str, value: object) -> object:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if value is not None and name == "utilisation_percent":
        return f"{value:.1f}"
    if value is not None and name in NUMERIC:
        return f"{value:,}"
    return value


def _print_report(rows: list[ReportRow], title: str) -> None:
    if not rows:
        click.echo(f"{title}: no windows")
        return
    headers = [HEADERS.get(name, name) for name in COLUMNS]
    numeric = {HEADERS.get(name, name) for name in NUMERIC}
    cells = [[_cell(name, getattr(row, name)) for name in COLUMNS] for row in rows]
    print_table(table(headers, cells, title, numeric=numeric))
