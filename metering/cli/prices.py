"""``metering prices set|remove|list``: a limit's price per unit, effective-dated.

A price holds from ``--from`` (default now) until the limit's next price;
every charge of a priced limit also charges its subject's spend limits of
the price's currency (docs/money.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import click

from metering.cli.context import SentenceGroup, current_meter
from metering.cli.entitlements import from_option, limit_argument, limit_filter
from metering.cli.options import format_option
from metering.cli.output import echo_listing, when_us
from metering.domain.money import Price, format_price

PRICE_COLUMNS: Final = ("limit", "per unit", "currency", "effective from", "recorded")


def describe_price(price: Price) -> str:
    """One line: ``calls: 0.002 USD a unit from 2026-11-01 00:00:00 UTC``."""
    when = when_us(price.effective_from_us)
    if price.per_unit is None:
        return f"{price.limit}: no price from {when}"
    shown = format_price(price.per_unit, price.currency)
    return f"{price.limit}: {shown} {price.currency} a unit from {when}"


@click.group(cls=SentenceGroup)
def prices() -> None:
    """Price limits per unit; priced usage charges spend limits."""


@prices.command("set")
@limit_argument
@click.option("--per-unit", required=True, metavar="AMOUNT", help="Major units: 0.002, 1.50.")
@click.option("--currency", required=True, help="ISO 4217 code, e.g. USD.")
@from_option("the price")
def prices_set(limit: str, per_unit: str, currency: str, effective_from: datetime | None) -> None:
    """Price LIMIT at --per-unit --currency from --from (default now) on.

    A price may have 6 decimals more than the currency's minor unit (USD:
    8); each charge's amount is rounded half to even to the minor unit.
    """
    click.echo(describe_price(current_meter().set_price(limit, per_unit, currency, effective_from)))


@prices.command("remove")
@limit_argument
@click.option("--currency", required=True, help="The currency of the price that ends.")
@from_option("the end of the price")
def prices_remove(limit: str, currency: str, effective_from: datetime | None) -> None:
    """End LIMIT's price from --from (default now) on; earlier usage keeps its price."""
    click.echo(describe_price(current_meter().remove_price(limit, currency, effective_from)))


@prices.command("list")
@limit_filter
@format_option
def prices_list(limit: str | None, fmt: str) -> None:
    """Every price change, oldest first per limit."""
    found = current_meter().prices(limit)
    echo_listing(found, fmt, "no prices: add one with `metering prices set`", PRICE_COLUMNS, _row)


def _row(p: Price) -> list[object]:
    return [
        p.limit,
        "none" if p.per_unit is None else format_price(p.per_unit, p.currency),
        p.currency,
        when_us(p.effective_from_us),
        when_us(p.created_at_us),
    ]
