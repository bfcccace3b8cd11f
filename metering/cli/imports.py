"""``metering import FILE``: history into the ledger, exactly once by id."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import (
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from metering.cli.context import current_meter
from metering.cli.options import PROGRESS_OPTION
from metering.imports import ImportSummary


class _Rate(ProgressColumn):
    """Events a second, as rich measures them."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed or 0:,.0f} events/s")


@click.command("import")
@click.argument("file", metavar="FILE")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "csv"]),
    default=None,
    help="The input's format (default: by the suffix, else by its first line).",
)
@click.option(
    "--no-enforce",
    is_flag=True,
    help="History that happened: never deny (fixed windows decided as soft, "
    "token buckets as shadow), no notifications.",
)
@click.option("--allow-late", is_flag=True, help="Accept events older than a limit's lateness.")
@click.option(
    "--strict", is_flag=True, help="Check every line first; import nothing if one is bad."
)
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=1000, show_default=True)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@PROGRESS_OPTION
def import_(
    file: str,
    fmt: str | None,
    no_enforce: bool,
    allow_late: bool,
    strict: bool,
    batch_size: int,
    output: str,
    progress: bool | None,
) -> None:
    """Apply the events of FILE (JSON Lines, or CSV with the header
    event_id,subject,limit,cost,occurred_at[,metadata columns]; - for standard
    input) through the batch path, exactly once by id: a second run changes
    nothing and counts the duplicates. A bad line is reported with its number
    and the others are applied (unless --strict). Exit 1 when a line was bad."""
    meter = current_meter()
    with _bar(
        sys.stderr.isatty() if progress is None else progress, forced=bool(progress)
    ) as advance:
        summary = meter.import_events(
            file,
            fmt=fmt,  # type: ignore[arg-type]
            enforce=not no_enforce,
            allow_late=allow_late,
            strict=strict,
            batch_size=batch_size,
            progress=advance,
        )
    if output == "json":
        click.echo(json.dumps(summary.to_dict()))
    else:
        _print(summary)
    if summary.bad:
        sys.exit(1)


def _print(summary: ImportSummary) -> None:
    click.echo(
        f"{summary.events} events: {summary.applied} applied, {summary.denied} denied, "
        f"{summary.rejected} rejected, {summary.duplicates} already there (duplicates), "
        f"{summary.conflicts} conflicts; {summary.bad} bad lines"
    )
    for bad in summary.bad_lines:
        click.echo(f"bad {bad}", err=True)
    if summary.bad > len(summary.bad_lines):
        click.echo(f"... and {summary.bad - len(summary.bad_lines)} more bad lines", err=True)


@contextmanager
def _bar(shown: bool, *, forced: bool) -> Iterator[Callable[[int], None] | None]:
    """The progress bar on stderr (``forced``: drawn even where it is no terminal)."""
    if not shown:
        yield None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.completed:,} events"),
        _Rate(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True, force_terminal=forced or None)) as bar:
        task = bar.add_task("import", total=None)
        yield lambda count: bar.advance(task, count)
