"""``metering limits set|list|delete|load``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import click

from metering.cli.context import (
    CliError,
    SentenceGroup,
    current_meter,
    database_url,
    did_you_mean,
)
from metering.cli.options import format_option
from metering.cli.output import describe_limit, echo_listing
from metering.domain.kinds import kind_phrases
from metering.domain.limits import (
    AGGREGATIONS,
    ALGORITHMS,
    ENFORCEMENTS,
    WINDOWS,
    Limit,
    is_reserved,
    spend_limit,
)
from metering.domain.money import format_amount
from metering.errors import InvalidLimit, UnknownLimit
from metering.storage.limit_rows import bare_limits

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


@click.group(cls=SentenceGroup)
def limits() -> None:
    """Define, list, delete and load limits."""


@limits.command("set")
@click.argument("name")
@click.option("--max", "maximum", type=int, help="Inclusive maximum per period.")
@click.option(
    "--max-amount",
    metavar="AMOUNT",
    help="A spend limit's maximum in major units of --currency (50, 1.00).",
)
@click.option("--currency", help="ISO 4217 code: makes a spend limit (with --max-amount).")
@click.option("--period", help="30s, 2m, 1h, 1d, 7d, 1mo ... (none for a concurrent limit).")
@click.option(
    "--algorithm",
    type=click.Choice(ALGORITHMS),
    help="Default: fixed_window. concurrent: floating licenses (metering checkout), no --period.",
)
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
@click.option(
    "--aggregation",
    type=click.Choice(AGGREGATIONS),
    help="Default: sum (costs add up). max, latest: a gauge; each event reports a level.",
)
@click.option(
    "--pacing",
    is_flag=True,
    default=None,
    help="Spread the maximum over the window: by an instant, its share plus --burst.",
)
@click.option(
    "--burst",
    metavar="N|P%",
    help="With --pacing: units, or a percentage of the maximum, allowed ahead. Default: 5%.",
)
@click.option(
    "--forecast-lead",
    metavar="DURATION",
    help="Send limit.forecast once a window when the allowance runs out within it: 24h.",
)
@click.option(
    "--breaker",
    metavar="FACTORx",
    help="Quarantine a subject whose rate runs past this multiple of its baseline "
    "for a minute: 10x (docs/breaker.md).",
)
@click.option(
    "--breaker-floor",
    metavar="RATE",
    help="With --breaker: the least baseline, in units per second; lets a subject "
    "with under a day of history be judged.",
)
@click.option(
    "--quarantine-max",
    type=int,
    metavar="N",
    help="With --breaker: what a quarantined subject may use of a window. "
    "Default: the maximum divided by the factor.",
)
def limits_set(
    name: str,
    maximum: int | None,
    max_amount: str | None,
    currency: str | None,
    period: str | None,
    **options: Any,
) -> None:
    """Create or replace the limit NAME (a spend limit with --max-amount and --currency)."""
    if period is None and options.get("algorithm") != "concurrent":
        raise click.UsageError("--period is required (only --algorithm concurrent has none)")
    chosen = {key: value for key, value in options.items() if value not in (None, ())}
    if max_amount is not None or currency is not None:
        if maximum is not None:
            raise InvalidLimit("max", "a spend limit takes --max-amount, not --max")
        if currency is None:
            raise InvalidLimit("currency", "a spend limit needs --currency (ISO 4217, e.g. USD)")
        if max_amount is None:
            raise InvalidLimit("max_amount", f"a spend limit needs --max-amount in {currency}")
        limit = spend_limit(name, max_amount, currency, period or "", **chosen)
    elif maximum is None:
        raise InvalidLimit("max", "give --max (or --max-amount and --currency)")
    else:
        limit = Limit(name, maximum, period or "", **chosen)
    click.echo(describe_limit(current_meter().set_limit(limit)))


def _limit_row(limit: Limit) -> list[object]:
    window = [limit.window] if limit.algorithm == "fixed_window" else []
    algorithm = " ".join([limit.algorithm, *window, *kind_phrases(limit)])
    levels = [f"{t}%" for t in limit.thresholds] + [str(t) for t in limit.thresholds_units]
    thresholds = ", ".join(levels) or None
    dimensions = ", ".join(limit.dimensions) or None
    maximum: object = limit.maximum
    if limit.currency:
        maximum = f"{format_amount(limit.maximum, limit.currency)} {limit.currency}"
    row: list[object] = [limit.name, maximum, limit.period, algorithm, limit.enforcement]
    return [*row, thresholds, limit.lateness, dimensions]


@limits.command("list")
@format_option
@click.option("--all", "show_all", is_flag=True, help="Also the product's own limits (metering.*).")
def limits_list(fmt: str, show_all: bool) -> None:
    """List the limits (the product's own, metering.*, only with --all)."""
    # A SQLite file at this schema is read bare: no database stack to import.
    listed = bare_limits(database_url())
    if listed is None:
        listed = current_meter().list_limits()
    found = [limit for limit in listed if show_all or not is_reserved(limit.name)]
    empty = "no limits defined: add one with `metering limits set`"
    echo_listing(found, fmt, empty, LIMIT_COLUMNS, _limit_row)


@limits.command("delete")
@click.argument("name")
def limits_delete(name: str) -> None:
    """Delete the limit NAME (its counters are kept for reports)."""
    meter = current_meter()
    try:
        meter.delete_limit(name)
    except UnknownLimit:
        raise CliError(
            did_you_mean(meter, name) or f"no limit {name!r} to delete (`metering limits list`)"
        ) from None
    click.echo(f"deleted limit {name}")


@limits.command("load")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def limits_load(file: Path) -> None:
    """Load limits from a YAML or TOML FILE: all of them, or none."""
    loaded = current_meter().load_limits(file)
    click.echo(f"loaded {len(loaded)} limit{'' if len(loaded) == 1 else 's'} from {file}")
