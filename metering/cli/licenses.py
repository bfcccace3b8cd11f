"""``metering checkout SUBJECT LIMIT``, ``checkout renew|list`` and ``metering checkin ID``."""

from __future__ import annotations

import json
from typing import Final

import click

from metering.cli.context import SentenceGroup, current_meter
from metering.cli.options import format_option
from metering.cli.output import EXIT_DENIED, when
from metering.cli.tables import print_table, table
from metering.domain.licenses import DEFAULT_TTL_SECONDS
from metering.domain.limits import parse_period
from metering.errors import InvalidInput
from metering.licenses import Checkout

CHECKOUT_COLUMNS: Final = ("id", "subject", "limit", "cost", "state", "created", "expires", "by")
DEFAULT_TTL: Final = "15m"
assert parse_period(DEFAULT_TTL).seconds == DEFAULT_TTL_SECONDS


def _ttl_seconds(text: str | None) -> float | None:
    """``--ttl 15m`` (seconds, minutes, hours, days or weeks) as seconds."""
    if text is None:
        return None
    period = parse_period(text, field_name="ttl")
    if period.is_calendar_months:
        raise InvalidInput("ttl", "use seconds, minutes, hours, days or weeks")
    return float(period.seconds)


class _CheckoutGroup(SentenceGroup):
    """``checkout SUBJECT LIMIT`` is short for ``checkout new SUBJECT LIMIT``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["new", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_CheckoutGroup)
def checkout() -> None:
    """Floating licenses: metering checkout SUBJECT LIMIT [--cost N] [--ttl 15m].

    A subject named like a subcommand (new, renew, list) is checked out with
    metering checkout new SUBJECT LIMIT.
    """


@checkout.command("new")
@click.argument("subject")
@click.argument("limit")
@click.option("--cost", type=int, default=1, show_default=True, help="Units (licenses) to hold.")
@click.option(
    "--ttl",
    default=DEFAULT_TTL,
    show_default=True,
    help="Held until checked in or for this long (renew to keep it).",
)
@click.option("--id", "checkout_id", help="The checkout's id; a repeated id answers it while held.")
@format_option
def checkout_new(
    subject: str, limit: str, cost: int, ttl: str, checkout_id: str | None, fmt: str
) -> None:
    """Hold COST units of the concurrent LIMIT for SUBJECT.

    Prints just the checkout's id on stdout, for id=$(metering checkout ...);
    the rest goes to stderr. Denied (the maximum is held): nothing on stdout,
    exit 2. With --format json: the whole record on stdout. An --id whose
    checkout has ended (checked in, or expired): error, exit 1; take a new id.
    """
    seconds = _ttl_seconds(ttl)
    assert seconds is not None
    found = current_meter().checkout(
        subject, limit, cost, ttl_seconds=seconds, checkout_id=checkout_id
    )
    if fmt == "json":
        click.echo(json.dumps(found.to_dict(), indent=2))
    elif found.allowed:
        click.echo(found.id)
        held = f"{found.held} of {found.maximum} held"
        click.echo(f"checked out {found.id} until {when(found.expires_at)} ({held})", err=True)
    else:
        retry = f"; retry at {when(found.retry_at)}" if found.retry_at else ""
        click.echo(f"denied: {found.held} of {found.maximum} held{retry}", err=True)
    if not found.allowed:
        click.get_current_context().exit(EXIT_DENIED)


@checkout.command("renew")
@click.argument("checkout_id")
@click.option("--ttl", help="Held for this long from now. Default: the checkout's own.")
def checkout_renew(checkout_id: str, ttl: str | None) -> None:
    """Keep a held checkout longer (an expired or checked-in one: error)."""
    renewed = current_meter().renew(checkout_id, _ttl_seconds(ttl))
    click.echo(f"renewed {renewed.id} until {when(renewed.expires_at)}")


@checkout.command("list")
@click.option("--subject", help="Only this subject's checkouts.")
@click.option("--limit", help="Only checkouts of this limit.")
@click.option(
    "--state",
    type=click.Choice(["held", "released"]),
    help="As it stands now: an expired checkout is released, swept or not.",
)
@click.option(
    "--last",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="How many, newest first.",
)
@format_option
def checkout_list(
    subject: str | None, limit: str | None, state: str | None, last: int, fmt: str
) -> None:
    """The newest checkouts (an expired one shows released, by expiry)."""
    found = current_meter().checkouts(subject, limit, state, last)
    if fmt == "json":
        click.echo(json.dumps([c.to_dict() for c in found], indent=2))
        return
    print_table(table(CHECKOUT_COLUMNS, [_row(c) for c in found]))


def _row(found: Checkout) -> list[object]:
    return [
        found.id,
        found.subject,
        found.limit,
        found.cost,
        found.state,
        when(found.created_at),
        when(found.expires_at),
        found.released_by,
    ]


@click.command()
@click.argument("checkout_id")
def checkin(checkout_id: str) -> None:
    """Give a checkout back (once: a second checkin gives nothing back)."""
    meter = current_meter()
    returned = meter.checkin(checkout_id)
    if returned:
        click.echo(f"checked in {checkout_id}: {returned} given back")
        return
    info = meter.checkout_info(checkout_id)
    how = "expired" if info is not None and info.released_by == "expiry" else "checked in"
    click.echo(f"{checkout_id} was already {how}: nothing given back")
