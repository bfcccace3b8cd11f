"""``metering entitlements set|list|delete|load``: per-subject maximums.

An entitlement gives one subject its own maximum for a limit from an instant
on (``--from``, default now). Nothing is overwritten: each command records a
change, and the history stays, so a past window keeps the maximum it had.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from metering.cli.context import SentenceGroup, current_meter
from metering.cli.options import format_option, parse_datetime
from metering.cli.output import echo_listing, when_us
from metering.domain.grants import Entitlement
from metering.domain.limits import validate_limit_name
from metering.domain.money import parse_amount
from metering.errors import InvalidInput

F = TypeVar("F", bound=Callable[..., Any])
ENTITLEMENT_COLUMNS: Final = ("subject", "limit", "maximum", "effective from", "recorded")


def from_option(what: str) -> Callable[[F], F]:
    """``--from TIME`` (RFC 3339): when ``what`` takes effect."""
    return click.option(
        "--from",
        "effective_from",
        metavar="TIME",
        callback=parse_datetime,
        help=f"When {what} takes effect (default now): RFC 3339, naive means UTC.",
    )


def parse_limit_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A limit's name, checked here so that an error names LIMIT (the library says ``name``)."""
    if value is None:
        return None
    try:
        return validate_limit_name(value)
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None


def limit_argument(func: F) -> F:
    return click.argument("limit", callback=parse_limit_name)(func)


def limit_filter(func: F) -> F:
    return click.option("--limit", callback=parse_limit_name, help="Only this limit.")(func)


def listing_filters(func: F) -> F:
    """``--subject``, ``--limit`` and ``--format`` of a listing of subjects' records."""
    return click.option("--subject", help="Only this subject.")(limit_filter(format_option(func)))


def describe_entitlement(change: Entitlement) -> str:
    """One line: ``org-42 api_calls: maximum 5000 from 2026-12-01 00:00:00 UTC``."""
    maximum = "the limit's default" if change.maximum is None else f"maximum {change.maximum}"
    return f"{change.subject} {change.limit}: {maximum} from {when_us(change.effective_from_us)}"


def _row(e: Entitlement) -> list[object]:
    return [
        e.subject,
        e.limit,
        "default" if e.maximum is None else e.maximum,
        when_us(e.effective_from_us),
        when_us(e.created_at_us),
    ]


@click.group(cls=SentenceGroup)
def entitlements() -> None:
    """Give subjects their own maximum for a limit (upgrades, downgrades)."""


@entitlements.command("set")
@click.argument("subject")
@limit_argument
@click.argument("maximum", type=int, required=False)
@click.option(
    "--max-amount",
    metavar="AMOUNT",
    help="A spend limit's cap for SUBJECT, in major units of its currency (instead of MAXIMUM).",
)
@from_option("the maximum")
def entitlements_set(
    subject: str,
    limit: str,
    maximum: int | None,
    max_amount: str | None,
    effective_from: datetime | None,
) -> None:
    """SUBJECT's own MAXIMUM for LIMIT from --from (default now) on.

    An upgrade mid-window applies from then on and the window's usage
    carries over; a downgrade below what is used denies hard charges until
    the window resets, and takes nothing back. A spend limit's cap is
    given with --max-amount (50, 1.00).
    """
    meter = current_meter()
    if (maximum is None) == (max_amount is None):
        raise InvalidInput("maximum", "give MAXIMUM, or --max-amount for a spend limit")
    if max_amount is not None:
        currency = meter.get_limit(limit).currency
        if currency is None:
            raise InvalidInput("max_amount", f"{limit!r} is not a spend limit: give MAXIMUM")
        maximum = parse_amount(max_amount, currency, field_name="max_amount")
    change = meter.set_entitlement(subject, limit, maximum, effective_from)
    click.echo(describe_entitlement(change))


@entitlements.command("delete")
@click.argument("subject")
@limit_argument
@from_option("the return to the default")
def entitlements_delete(subject: str, limit: str, effective_from: datetime | None) -> None:
    """Return SUBJECT to LIMIT's default maximum from --from (default now) on.

    The history stays: earlier windows keep the maximum they had.
    """
    change = current_meter().delete_entitlement(subject, limit, effective_from)
    click.echo(describe_entitlement(change))


@entitlements.command("list")
@listing_filters
def entitlements_list(subject: str | None, limit: str | None, fmt: str) -> None:
    """Every change of a subject's maximum, oldest first per subject and limit."""
    found = current_meter().entitlements(subject, limit)
    empty = "no entitlements: every subject has its limits' maximums"
    echo_listing(found, fmt, empty, ENTITLEMENT_COLUMNS, _row)


@entitlements.command("load")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def entitlements_load(file: Path) -> None:
    """Load entitlements from a YAML or TOML FILE: all of them, or none.

    \b
    entitlements:
      - {subject: org-42, limit: api_calls, maximum: 5000}
      - {subject: org-7, limit: api_calls, maximum: 20000,
         effective_from: 2026-12-01T00:00:00Z}
    """
    loaded = current_meter().load_entitlements(file)
    noun = "entitlement" if len(loaded) == 1 else "entitlements"
    click.echo(f"loaded {len(loaded)} {noun} from {file}")
