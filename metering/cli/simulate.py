"""``metering simulate``: backtest proposed limits on the stored demand.

Replays the results ledger's events since ``--since`` through the limits of
``--limits`` (laid over those in force) and the entitlements of
``--entitlements``, in memory (`metering.simulation`); nothing is written.
A progress bar goes to stderr when it is a terminal (or with ``--progress``).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from metering import simulation
from metering.cli.context import current_meter
from metering.cli.options import FORMAT_OPTION, PROGRESS_OPTION
from metering.cli.tables import print_table, table
from metering.domain.instants import clock_text
from metering.domain.replay import SIMULATION_COLUMNS
from metering.errors import InvalidInput
from metering.reports.export import neutralise
from metering.simulation import Simulation, Since, parse_since

NUMERIC = frozenset(SIMULATION_COLUMNS[2:])
# The table's headers are words, as the other commands' (CSV and JSON keep the field names).
HEADERS: Final = {
    "would_deny_events": "would-deny events",
    "would_deny_cost": "would-deny cost",
    "denied_events_then": "denied events then",
}


def _since(_ctx: click.Context, _param: click.Parameter, value: str) -> Since:
    try:
        return parse_since(value)
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None


@click.command()
@click.option(
    "--limits",
    "limits_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Proposed limits (YAML or TOML, as `limits load` reads).",
)
@click.option(
    "--entitlements",
    "entitlements_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Proposed per-subject maximums (as `entitlements load` reads).",
)
@click.option(
    "--since",
    required=True,
    callback=_since,
    metavar="DURATION|TIME",
    help="Replay events since: 30d, 12h ... before now, or an RFC 3339 time.",
)
@click.option("--subject", help="Only this subject's charges.")
@FORMAT_OPTION
@PROGRESS_OPTION
def simulate(
    limits_path: Path,
    entitlements_path: Path | None,
    since: Since,
    subject: str | None,
    fmt: str,
    progress: bool | None,
) -> None:
    """Backtest proposed limits: what they would have denied since --since.

    Per subject and limit: events, events that would be denied and their cost,
    overage (allowed usage above the maximum), and events denied then.
    Nothing is written.
    """
    meter = current_meter()
    show = sys.stderr.isatty() if progress is None else progress
    with _bar(show) as on_progress:
        found = meter.simulate(
            limits_path, entitlements_path, since=since, subject=subject, progress=on_progress
        )
    _write(found, fmt)


@contextmanager
def _bar(show: bool) -> Iterator[simulation.Progress | None]:
    if not show:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    console = Console(stderr=True)
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("replaying events", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _write(found: Simulation, fmt: str) -> None:
    rows = [row.to_dict() for row in found.rows]
    if fmt == "json":
        click.echo(json.dumps(found.to_dict(), indent=2))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(SIMULATION_COLUMNS)
        for row in rows:
            writer.writerow(neutralise(v) if isinstance(v, str) else v for v in row.values())
    else:
        title = f"Backtest, {found.events:,} events since {clock_text(found.since)} UTC"
        if not rows:
            click.echo(f"{title}: no events")
            return
        cells = [[f"{v:,}" if k in NUMERIC else v for k, v in row.items()] for row in rows]
        headers = [HEADERS.get(name, name) for name in SIMULATION_COLUMNS]
        numeric = {HEADERS.get(name, name) for name in NUMERIC}
        print_table(table(headers, cells, title, numeric=numeric))
