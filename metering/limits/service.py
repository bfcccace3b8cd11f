"""Limit administration: create, replace, load, read and delete limits.

Names of the product's own (``metering.*``) are written only through
`set_product_limit`; users get `ReservedLimit` for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import Connection

from metering.domain.limits import Limit, is_reserved, validate_limit_name
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit
from metering.limits.files import load_limits_file
from metering.storage.database import Database
from metering.storage.prices import PriceStore
from metering.storage.quota_notices import notify
from metering.storage.store import Store


def _check_type(limit: object) -> None:
    if not isinstance(limit, Limit):
        raise InvalidInput("limit", f"expected a Limit, got {type(limit).__name__}")


def set_limits(database: Database, limits: Iterable[Limit]) -> list[Limit]:
    """Create or replace several limits in one transaction (all or none)."""
    chosen = list(limits)
    for limit in chosen:
        _check_type(limit)
        if is_reserved(limit.name):
            raise ReservedLimit(limit.name, "create or change")
    now_us = database.now_us()

    def work(connection: Connection) -> None:
        store = Store(connection)
        for limit in chosen:
            if limit.is_gauge:
                _refuse_priced_gauge(connection, limit.name)
            store.upsert_limit(limit, now_us)
            notify(connection, None, limit.name)  # a lowered maximum: every process's leases

    database.run(work)
    return chosen


def _refuse_priced_gauge(connection: Connection, name: str) -> None:
    """A limit with a price in force cannot become a gauge: a level is not priced."""
    latest: dict[str, int | None] = {}
    for price in PriceStore(connection).prices(name):  # oldest first
        latest[price.currency] = price.per_unit
    if any(per_unit is not None for per_unit in latest.values()):
        raise InvalidInput(
            "aggregation", f"{name!r} has a price: remove it before making the limit a gauge"
        )


def set_product_limit(database: Database, limit: Limit) -> Limit:
    """Create or replace one of the product's own limits (``metering.*``)."""
    _check_type(limit)
    if not is_reserved(limit.name):
        raise ReservedLimit(limit.name, "define it as the product's own (not metering.*)")
    now_us = database.now_us()
    database.run(lambda c: Store(c).upsert_limit(limit, now_us))
    return limit


def load_limits(database: Database, path: str | Path) -> list[Limit]:
    """Validate a YAML or TOML file of limits and store them all, or none."""
    return set_limits(database, load_limits_file(path))


def get_limit(database: Database, name: str) -> Limit:
    validate_limit_name(name)
    found = database.run(lambda c: Store(c).load_limits([name]))
    if name not in found:
        raise UnknownLimit(name)
    return found[name]


def list_limits(database: Database) -> list[Limit]:
    return database.run(lambda c: Store(c).list_limits())


def delete_limit(database: Database, name: str) -> None:
    """Delete a limit; its counters stay, for reports."""
    validate_limit_name(name)
    if is_reserved(name):
        raise ReservedLimit(name, "delete")
    if not database.run(lambda c: Store(c).delete_limit(name)):
        raise UnknownLimit(name)
