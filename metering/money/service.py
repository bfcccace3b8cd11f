"""The transactions of prices (`Meter.set_price`, `Meter.prices`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from metering.domain.instants import to_us
from metering.domain.kinds import refuse
from metering.domain.limits import Limit, is_reserved, validate_limit_name
from metering.domain.money import (
    Price,
    parse_amount,
    parse_price,
    parse_tier,
    validate_currency,
    validate_model,
    validate_tiers,
)
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit
from metering.storage.database import Database
from metering.storage.prices import PriceStore
from metering.storage.store import Store


def _priceable(connection: Connection, name: str, price: Price) -> Limit:
    found = Store(connection).load_limits([name]).get(name)
    if found is None:
        raise UnknownLimit(name)
    refuse(found, "price")
    if price.counted:
        refuse(found, "tiered price")
    return found


@dataclass(frozen=True, slots=True)
class Tiered:
    """A price's model and its fields as given (major units, text), checked by `_change`."""

    model: str = "per_unit"
    tiers: Sequence[object] = ()
    package: object = None
    per_package: object | None = None
    flat_fee: object | None = None


def _priced(code: str, per_unit: object | None, tiered: Tiered) -> dict[str, Any]:
    """The fields of a `Price` of ``tiered``'s model, each checked."""
    micro = None if per_unit is None else parse_price(per_unit, code)
    tiers = tuple(parse_tier(tier, code) for tier in tiered.tiers)
    if tiers:
        validate_tiers(tiers)
    per_package = None if tiered.per_package is None else _package_price(tiered.per_package, code)
    validate_model(tiered.model, micro, tiers, tiered.package, per_package)
    flat = 0
    if tiered.flat_fee is not None:
        flat = parse_amount(tiered.flat_fee, code, field_name="flat_fee")
    assert tiered.package is None or isinstance(tiered.package, int)
    return {
        "per_unit": micro,
        "model": tiered.model,
        "tiers": tiers,
        "package": tiered.package,
        "per_package": per_package,
        "flat_fee": flat,
    }


def _package_price(value: object, code: str) -> int:
    try:
        return parse_price(value, code)
    except InvalidInput as exc:
        raise InvalidInput("per_package", exc.message) from exc


def _change(
    database: Database,
    limit: str,
    currency: str,
    per_unit: object | None,
    effective_from: datetime | None,
    tiered: Tiered | None = None,
) -> Price:
    validate_limit_name(limit)
    if is_reserved(limit):
        raise ReservedLimit(limit, "price")
    code = validate_currency(currency)
    fields: dict[str, Any] = (
        {"per_unit": None} if tiered is None else _priced(code, per_unit, tiered)
    )
    now_us = database.now_us()
    start_us = (
        now_us if effective_from is None else to_us(effective_from, field_name="effective_from")
    )
    price = Price(limit, code, effective_from_us=start_us, created_at_us=now_us, **fields)

    def work(connection: Connection) -> Price:
        _priceable(connection, limit, price)
        PriceStore(connection).set_price(price)
        return price

    return database.run(work)


def set_price(
    database: Database,
    limit: str,
    per_unit: object | None,
    currency: str,
    effective_from: datetime | None = None,
    tiered: Tiered | None = None,
) -> Price:
    """Price ``limit`` at ``per_unit`` (major units of ``currency``, exact: a
    string, int or `Decimal`, never a float) from ``effective_from`` (default:
    now) on, or by ``tiered``'s model (then ``per_unit`` None). A price set at
    the same instant is replaced."""
    tiered = tiered or Tiered()
    if per_unit is None and tiered.model == "per_unit":
        raise InvalidInput("per_unit", "is required (remove a price with remove_price)")
    return _change(database, limit, currency, per_unit, effective_from, tiered)


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
