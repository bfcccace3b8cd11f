"""``metering reserve`` and ``metering reservations list|cancel|commit|sweep``."""

from __future__ import annotations

import json
from typing import Final

import click

from metering.cli.context import SentenceGroup, current_meter
from metering.cli.options import ChargeTuple, charge_options, chosen_charges, format_option
from metering.cli.output import (
    EXIT_CODES_HELP,
    EXIT_DENIED,
    report_decision,
    when,
)
from metering.cli.tables import print_table, table
from metering.reservations import ReservationInfo

DEFAULT_LISTED: Final = 100
MAX_LISTED: Final = 100_000
RESERVATION_COLUMNS: Final = ("id", "state", "charges", "created", "expires", "settled", "by")


@click.command(epilog=EXIT_CODES_HELP)
@charge_options("reservation")
@click.option(
    "--ttl",
    "ttl_seconds",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds before the sweeper commits it.",
)
@click.option("--event-id", help="The reservation's id; a repeated id returns the same one.")
@format_option
def reserve(
    subject: str | None,
    limit: str | None,
    cost: int | None,
    charges: list[ChargeTuple],
    ttl_seconds: float,
    event_id: str | None,
    fmt: str,
) -> None:
    """Consume now, with the option to give it back: metering reservations cancel ID.

    Prints just the reservation's id on stdout, for id=$(metering reserve ...);
    the decision goes to stderr. Denied: nothing on stdout, exit 2. With
    --format json: the whole record on stdout.
    """
    wanted = chosen_charges(subject, limit, cost, charges)
    reservation = current_meter().reserve(
        charges=wanted, event_id=event_id, ttl_seconds=ttl_seconds
    )
    if fmt == "json":
        payload = {**reservation.decision.to_dict(), "reservation": reservation.state}
        click.echo(json.dumps(payload, indent=2))
        if not reservation.allowed:
            click.get_current_context().exit(EXIT_DENIED)
        return
    if reservation.allowed:
        click.echo(reservation.id)
    if reservation.state == "held":
        expires = when(reservation.expires_at)
        click.echo(f"reservation {reservation.id} held until {expires}", err=True)
    report_decision(reservation.decision, fmt, err=True)


@click.group(cls=SentenceGroup)
def reservations() -> None:
    """List, cancel and commit reservations (operators)."""


def _charges_text(info: ReservationInfo) -> str:
    return ", ".join(f"{c.subject} {c.limit} {c.cost}" for c in info.charges)


@reservations.command("list")
@click.option("--state", type=click.Choice(["held", "committed", "cancelled"]))
@click.option("--subject", help="Only reservations charging this subject.")
@click.option(
    "--last",
    type=click.IntRange(1, MAX_LISTED),
    default=DEFAULT_LISTED,
    show_default=True,
    help="How many, newest first.",
)
# Until 0.2: --limit was this row count, while everywhere else it names a limit.
@click.option("--limit", "legacy_last", type=click.IntRange(1, MAX_LISTED), hidden=True)
@format_option
def reservations_list(
    state: str | None, subject: str | None, last: int, legacy_last: int | None, fmt: str
) -> None:
    """The newest reservations.

    --limit N, the old name of --last N, still works until the next release,
    with a warning.
    """
    if legacy_last is not None:
        source = click.get_current_context().get_parameter_source("last")
        if source is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("give --last only (--limit is its deprecated name)")
        click.echo("warning: --limit is deprecated here: use --last (a row count)", err=True)
        last = legacy_last
    found = current_meter().reservations(state, subject, last)
    if fmt == "json":
        click.echo(json.dumps([info.to_dict() for info in found], indent=2))
        return
    rows: list[list[object]] = [
        [
            i.id,
            i.state,
            _charges_text(i),
            when(i.created_at),
            when(i.expires_at),
            when(i.settled_at),
            i.settled_by,
        ]
        for i in found
    ]
    print_table(table(RESERVATION_COLUMNS, rows))


@reservations.command("cancel")
@click.argument("reservation_id")
def reservations_cancel(reservation_id: str) -> None:
    """Give a held reservation's cost back (a second cancel does nothing)."""
    returned = current_meter().cancel_reservation(reservation_id)
    click.echo(f"cancelled {reservation_id}: {returned} given back")


@reservations.command("commit")
@click.argument("reservation_id")
@click.option(
    "--actual",
    type=int,
    metavar="K",
    help="What the work really used, in units: settle each charge at K; below its reserved "
    "cost the rest goes back (priced units with their money), above it the excess is "
    "charged (past a hard limit: overdraft; refused for priced usage).",
)
def reservations_commit(reservation_id: str, actual: int | None) -> None:
    """Make a held reservation final (at the actual amount, with --actual)."""
    meter = current_meter()
    returned = meter.commit_reservation(reservation_id, actual)
    tail = f": {returned} given back" if actual is not None else ""
    result = meter.result(reservation_id) if actual is not None else None
    overdraft = sum(c.overdraft for c in result.charges) if result is not None else 0
    if overdraft:
        tail += f", {overdraft} overdraft (usage past a hard limit, billed)"
    click.echo(f"committed {reservation_id}{tail}")


@reservations.command("sweep")
@click.option("--retention", type=float, help="Also delete settled ones older than SECONDS.")
def reservations_sweep(retention: float | None) -> None:
    """Commit reservations and release checkouts past their time to live (what beat does)."""
    if retention is not None and retention < 0:
        raise click.BadParameter("must not be negative", param_hint="--retention")
    swept = current_meter().sweep_reservations(retention_seconds=retention)
    counts = f"committed {swept['committed']}, released {swept['released']}"
    click.echo(f"{counts}, deleted {swept['deleted']}")
