"""``metering limits set|list|delete|load``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import click

from metering.cli.context import current_meter
from metering.cli.options import format_option
from metering.cli.output import describe_limit, print_table, table
from metering.domain.limits import ALGORITHMS, ENFORCEMENTS, WINDOWS, Limit, is_reserved

# The algorithm's cell names a fixed window's kind too, and the thresholds
# cell holds both kinds (percentages and units): the table fits 100 columns.
LIMIT_COLUMNS: Final = (
    "name",
    "maximum",
    "period",
    "algorithm",
    "enforcement",
    "thresholds",
    "lateness",
    "dimensions",
)


@click.group()
def limits() -> None:
    """Define, list, delete and load limits."""


@limits.command("set")
@click.argument("name")
@click.option("--max", "maximum", type=int, required=True, help="Inclusive maximum per period.")
@click.option("--period", required=True, help="30s, 2m, 1h, 1d, 7d, 1mo ...")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), help="Default: fixed_window.")
@click.option("--window", type=click.Choice(WINDOWS), help="Fixed window only. Default: first_use.")
@click.option(
    "--enforcement",
    type=click.Choice(ENFORCEMENTS),
    help="Default: hard. shadow: decided like hard, never denied (would_deny is recorded).",
)
@click.option("--threshold", "thresholds", type=int, multiple=True, help="Percent; repeatable.")
@click.option(
    "--threshold-units",
    "thresholds_units",
    type=int,
    multiple=True,
    help="An absolute amount of usage that notifies; repeatable.",
)
@click.option("--lateness", help="How late an event may arrive. Default: 1d.")
@click.option(
    "--dimension",
    "dimensions",
    multiple=True,
    metavar="KEY",
    help="A metadata key to record usage by (report usage --group-by); repeatable, at most 4.",
)
@click.option(
    "--distinct",
    metavar="KEY",
    help="Seats: count distinct values of this metadata key per window (fixed window only).",
)
def limits_set(name: str, maximum: int, period: str, **options: Any) -> None:
    """Create or replace the limit NAME."""
    chosen = {key: value for key, value in options.items() if value not in (None, ())}
    click.echo(describe_limit(current_meter().set_limit(Limit(name, maximum, period, **chosen))))


def _limit_row(limit: Limit) -> list[object]:
    algorithm: str = limit.algorithm
    if limit.algorithm == "fixed_window":
        algorithm = f"{algorithm} {limit.window}"
    levels = [f"{t}%" for t in limit.thresholds] + [str(t) for t in limit.thresholds_units]
    thresholds = ", ".join(levels) or None
    dimensions = ", ".join(limit.dimensions) or None
    if limit.distinct is not None:
        algorithm = f"{algorithm} distinct {limit.distinct}"
    row: list[object] = [limit.name, limit.maximum, limit.period, algorithm, limit.enforcement]
    return [*row, thresholds, limit.lateness, dimensions]


@limits.command("list")
@format_option
@click.option("--all", "show_all", is_flag=True, help="Also the product's own limits (metering.*).")
def limits_list(fmt: str, show_all: bool) -> None:
    """List the limits (the product's own, metering.*, only with --all)."""
    found = [
        limit for limit in current_meter().list_limits() if show_all or not is_reserved(limit.name)
    ]
    if fmt == "json":
        click.echo(json.dumps([limit.to_dict() for limit in found], indent=2))
    elif not found:
        click.echo("no limits defined: add one with `metering limits set`")
    else:
        print_table(table(LIMIT_COLUMNS, [_limit_row(limit) for limit in found]))


@limits.command("delete")
@click.argument("name")
def limits_delete(name: str) -> None:
    """Delete the limit NAME (its counters are kept for reports)."""
    current_meter().delete_limit(name)
    click.echo(f"deleted limit {name}")


@limits.command("load")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def limits_load(file: Path) -> None:
    """Load limits from a YAML or TOML FILE: all of them, or none."""
    loaded = current_meter().load_limits(file)
    click.echo(f"loaded {len(loaded)} limit{'' if len(loaded) == 1 else 's'} from {file}")
