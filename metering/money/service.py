"""The transactions of prices (`Meter.set_price`, `Meter.prices`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from metering.domain.instants import to_us
from metering.domain.limits import Limit, is_reserved, validate_limit_name
from metering.domain.money import Price, parse_price, validate_currency
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit
from metering.storage.database import Database
from metering.storage.prices import PriceStore
from metering.storage.store import Store


def _priceable(connection: Connection, name: str) -> Limit:
    found = Store(connection).load_limits([name]).get(name)
    if found is None:
        raise UnknownLimit(name)
    if found.currency is not None:
        raise InvalidInput(
            "limit", f"{name!r} is a spend limit ({found.currency}): it has a cap, not a price"
        )
    if found.distinct is not None or found.algorithm == "concurrent":
        # A seat's repeat costs 0 and a license is held, not spent: neither is priced per unit.
        kind = "a seat limit" if found.distinct is not None else "a concurrent limit"
        raise InvalidInput("limit", f"{name!r} is {kind}: only usage summed per window is priced")
    if found.is_gauge:
        raise InvalidInput(
            "limit", f"{name!r} is a gauge: its level is not usage summed per window, not priced"
        )
    return found


def _change(
    database: Database,
    limit: str,
    currency: str,
    per_unit: object | None,
    effective_from: datetime | None,
) -> Price:
    validate_limit_name(limit)
    if is_reserved(limit):
        raise ReservedLimit(limit, "price")
    code = validate_currency(currency)
    micro = None if per_unit is None else parse_price(per_unit, code)
    now_us = database.now_us()
    start_us = (
        now_us if effective_from is None else to_us(effective_from, field_name="effective_from")
    )
    price = Price(limit, code, micro, start_us, now_us)

    def work(connection: Connection) -> Price:
        _priceable(connection, limit)
        PriceStore(connection).set_price(price)
        return price

    return database.run(work)


def set_price(
    database: Database,
    limit: str,
    per_unit: object,
    currency: str,
    effective_from: datetime | None = None,
) -> Price:
    """Price ``limit`` at ``per_unit`` (major units of ``currency``, exact: a
    string, int or `Decimal`, never a float) from ``effective_from`` (default:
    now) on. A price set at the same instant is replaced."""
    if per_unit is None:
        raise InvalidInput("per_unit", "is required (remove a price with remove_price)")
    return _change(database, limit, currency, per_unit, effective_from)


def remove_price(
    database: Database, limit: str, currency: str, effective_from: datetime | None = None
) -> Price:
    """End ``limit``'s pricing from ``effective_from`` (default: now) on."""
    return _change(database, limit, currency, None, effective_from)


def prices(database: Database, limit: str | None = None) -> list[Price]:
    """Every price change, by limit and time (of ``limit`` only, if given)."""
    if limit is not None:
        validate_limit_name(limit)
    return database.run(lambda connection: PriceStore(connection).prices(limit))
