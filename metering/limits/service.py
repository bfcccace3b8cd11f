"""Limit administration: create, replace, load, read and delete limits.

Names of the product's own (``metering.*``) are written only through
`set_product_limit`; users get `ReservedLimit` for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import Connection

from metering.domain.kinds import refusing
from metering.domain.limits import Limit, is_reserved, validate_limit_name
from metering.domain.money import prices_from
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit
from metering.limits.files import load_limits_file
from metering.storage.counters import CounterStore
from metering.storage.database import Database
from metering.storage.prices import PriceStore
from metering.storage.quota_notices import notify
from metering.storage.reservations import ReservationStore
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
        store.hold_decisions(chosen)
        store.record_dimensions(chosen, now_us)
        store.record_definitions(chosen, now_us)
        for limit in chosen:
            _refuse_prices(connection, limit, now_us)
            _refuse_holds(connection, limit)
            before = store.load_limits([limit.name]).get(limit.name)
            _refuse_unit_change(connection, before, limit, now_us)
            store.upsert_limit(limit, now_us)
            notify(connection, None, limit.name)  # a lowered maximum: every process's leases

    database.run(work)
    return chosen


def _refuse_prices(connection: Connection, limit: Limit, now_us: int) -> None:
    """A limit priced now or from a later date does not become a kind that
    refuses a price (`metering.domain.kinds`: a gauge, seats, a spend limit,
    licenses; a token bucket when the price is tiered or has a flat fee)."""
    pricing = prices_from(PriceStore(connection).prices(limit.name), now_us)
    kind = refusing(limit, "price") if pricing else None
    if kind is None and any(price.counted for price in pricing):
        kind = refusing(limit, "tiered price")
    if kind is not None:
        currencies = ", ".join(sorted({price.currency for price in pricing}))
        raise InvalidInput(
            kind.made_by,
            f"{limit.name!r} has a price in {currencies}: remove it before making the limit "
            f"{kind.label}",
        )


def _refuse_holds(connection: Connection, limit: Limit) -> None:
    """A limit with held reservations does not become a kind that refuses a
    hold (seats, a gauge): a cancel would give their cost back to a counter
    that no longer sums it."""
    kind = refusing(limit, "hold")
    if kind is not None and ReservationStore(connection).holds_on(limit.name):
        raise InvalidInput(
            kind.made_by,
            f"{limit.name!r} has held reservations: commit or cancel them before making "
            f"the limit {kind.label}",
        )


def _counted_in(limit: Limit) -> str:
    """What a limit's counters hold: units, a currency's minor units, or levels."""
    if limit.currency is not None:
        return limit.currency
    return {"max": "peak levels", "latest": "last levels"}.get(limit.aggregation, "units")


def _refuse_unit_change(
    connection: Connection, before: Limit | None, limit: Limit, now_us: int
) -> None:
    """A limit whose windows not yet over have usage counted does not change
    what it counts in (units, a currency's minor units, a gauge's peak or
    last level): its windows' counters would be read in the new one, cents
    as units, a sum as a peak."""
    if before is None or _counted_in(before) == _counted_in(limit):
        return
    if CounterStore(connection).used_in_windows_after(limit.name, now_us):  # (a scan: rare)
        field = "currency" if before.currency != limit.currency else "aggregation"
        raise InvalidInput(
            field,
            f"{limit.name!r} has usage counted in {_counted_in(before)} in a window not yet "
            f"over: it would be read in {_counted_in(limit)}; give the limit a new name, or "
            "change it when its windows end",
        )


def set_product_limit(database: Database, limit: Limit) -> Limit:
    """Create or replace one of the product's own limits (``metering.*``)."""
    _check_type(limit)
    if not is_reserved(limit.name):
        raise ReservedLimit(limit.name, "define it as the product's own (not metering.*)")
    now_us = database.now_us()

    def work(connection: Connection) -> None:
        store = Store(connection)
        store.hold_decisions([limit])
        store.record_dimensions([limit], now_us)
        store.record_definitions([limit], now_us)
        store.upsert_limit(limit, now_us)

    database.run(work)
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
