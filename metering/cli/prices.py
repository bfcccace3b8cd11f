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
from metering.domain.money import MODELS, Price, format_amount, format_price

PRICE_COLUMNS: Final = ("limit", "per unit", "currency", "effective from", "recorded")


def describe_price(price: Price) -> str:
    """One line: ``calls: 0.002 USD a unit from 2026-11-01 00:00:00 UTC``."""
    when = when_us(price.effective_from_us)
    if not price.prices:
        return f"{price.limit}: no price from {when}"
    return f"{price.limit}: {describe_model(price)} from {when}"


def describe_model(price: Price) -> str:
    """``0.002 USD a unit``, ``graduated USD: up to 1000 at 0.01, then 0.005 a unit``,
    ``1.00 USD a package of 100 units``, each with ``, 20.00 USD a window`` for a fee."""
    currency = price.currency
    if price.model == "package":
        assert price.package is not None and price.per_package is not None
        shown = (
            f"{format_price(price.per_package, currency)} {currency} "
            f"a package of {price.package} units"
        )
    elif price.model in ("graduated", "volume"):
        steps = [
            f"up to {up_to} at {format_price(each, currency)}"
            if up_to is not None
            else f"{'then ' if len(price.tiers) > 1 else ''}{format_price(each, currency)}"
            for up_to, each in price.tiers
        ]
        shown = f"{price.model} {currency}: {', '.join(steps)} a unit"
    else:
        assert price.per_unit is not None
        shown = f"{format_price(price.per_unit, currency)} {currency} a unit"
    if price.flat_fee:
        shown += f", {format_amount(price.flat_fee, currency)} {currency} a window"
    return shown


@click.group(cls=SentenceGroup)
def prices() -> None:
    """Price limits per unit; priced usage charges spend limits."""


@prices.command("set")
@limit_argument
@click.option("--per-unit", metavar="AMOUNT", help="Major units: 0.002, 1.50 (the per_unit model).")
@click.option("--currency", required=True, help="ISO 4217 code, e.g. USD.")
@click.option(
    "--model",
    type=click.Choice(MODELS),
    default="per_unit",
    show_default=True,
    help="How the window's units are priced.",
)
@click.option(
    "--tier",
    "tiers",
    multiple=True,
    metavar="UP_TO:PRICE",
    help="graduated and volume: a tier, e.g. 1000:0.01; the last up to inf. Repeat.",
)
@click.option("--package", type=int, metavar="UNITS", help="package: units in a package.")
@click.option("--per-package", metavar="AMOUNT", help="package: a package's price, major units.")
@click.option("--flat-fee", metavar="AMOUNT", help="Charged once a window, with any model.")
@from_option("the price")
def prices_set(
    limit: str,
    per_unit: str | None,
    currency: str,
    model: str,
    tiers: tuple[str, ...],
    package: int | None,
    per_package: str | None,
    flat_fee: str | None,
    effective_from: datetime | None,
) -> None:
    """Price LIMIT at --per-unit --currency from --from (default now) on, or
    by --model: graduated (each unit of the window at its tier's price),
    volume (every unit at the tier the window's total reaches), each with
    --tier UP_TO:PRICE sorted, the last inf; package (--per-package for each
    block of --package units, rounded up). --flat-fee is charged once a window.

    A price may have 6 decimals more than the currency's minor unit (USD:
    8); each charge's amount is rounded half to even to the minor unit.
    """
    found = current_meter().set_price(
        limit,
        per_unit,
        currency,
        effective_from,
        model=model,
        tiers=tiers,
        package=package,
        per_package=per_package,
        flat_fee=flat_fee,
    )
    click.echo(describe_price(found))


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
        "none" if not p.prices else _rate(p),
        p.currency,
        when_us(p.effective_from_us),
        when_us(p.created_at_us),
    ]


def _rate(price: Price) -> str:
    """The price's column in a listing: the per-unit price, or the model in full."""
    if price.model == "per_unit" and not price.flat_fee:
        assert price.per_unit is not None
        return format_price(price.per_unit, price.currency)
    return describe_model(price)
