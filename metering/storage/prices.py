"""Prices in SQL (see `metering.domain.money`).

A price change bumps the limits' version, like an entitlement: every
process's `LimitCache` learns which limits are priced in the statement that
reads the version, so the hot paths decline a priced charge without a
lookup per event (the general engine decides money).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from typing import Final

from sqlalchemy import ColumnElement, and_, bindparam, func, or_, select

from metering.domain.money import Price, PriceHistory, Tier
from metering.domain.rollups import SPEND_DIMENSION
from metering.storage.limits import BUMP_LIMITS_VERSION
from metering.storage.on_connection import OnConnection
from metering.storage.records import RecordColumns
from metering.storage.rollups import ROLLUPS
from metering.storage.tables import limits, prices


def _tiers_text(tiers: tuple[Tier, ...]) -> str | None:
    return json.dumps([list(tier) for tier in tiers]) if tiers else None


def _tiers_of(text: str | None) -> tuple[Tier, ...]:
    return tuple((up_to, price) for up_to, price in json.loads(text)) if text else ()


_PRICE: Final = RecordColumns(
    Price,
    columns={"limit": "limit_name", "package": "package_size"},
    read={"tiers": _tiers_of},
    write={"tiers": _tiers_text},
)


# What the hot path's cache reads on every reload, built once: a statement
# used again needs no new cache key.
_HISTORIES: Final = select(prices).order_by(prices.c.limit_name, prices.c.effective_from_us)
_SPEND_LIMITS: Final = (
    select(limits.c.currency, limits.c.name)
    .where(limits.c.currency.is_not(None))
    .order_by(limits.c.currency, limits.c.name)
)


class PriceStore(OnConnection):
    """Statements on one connection; the caller owns the transaction."""

    def set_price(self, price: Price) -> None:
        """Record a price from its ``effective_from_us``; one at the same instant is replaced."""
        self._upsert(prices, _PRICE.values(price), key=["limit_name", "effective_from_us"])
        self.connection.execute(BUMP_LIMITS_VERSION)

    def prices(self, limit: str | None = None) -> list[Price]:
        query = select(prices)
        if limit is not None:
            query = query.where(prices.c.limit_name == limit)
        query = query.order_by(prices.c.limit_name, prices.c.effective_from_us)
        return [_PRICE.of_row(row) for row in self.connection.execute(query)]

    def histories(self, names: Iterable[str] | None = None) -> dict[str, PriceHistory]:
        """Each limit's prices in time order (``names`` None: every priced limit)."""
        query = _HISTORIES
        if names is not None:
            wanted = sorted(set(names))
            if not wanted:
                return {}
            query = query.where(prices.c.limit_name.in_(bindparam("names", expanding=True)))
            rows = self.connection.execute(query, {"names": wanted})
        else:
            rows = self.connection.execute(query)
        found: dict[str, list[Price]] = defaultdict(list)
        for row in rows:
            found[row.limit_name].append(_PRICE.of_row(row))
        return {name: tuple(history) for name, history in found.items()}

    def spend_limits(self) -> dict[str, list[str]]:
        """The spend limits' names by currency, sorted."""
        query = _SPEND_LIMITS
        found: dict[str, list[str]] = defaultdict(list)
        for currency, name in self.connection.execute(query):
            found[currency].append(name)
        return dict(found)

    def spend_amounts(
        self,
        since_us: int | None,
        until_us: int | None,
        subject: str | None = None,
        zoned: Mapping[tuple[int, int], Collection[str]] | None = None,
    ) -> list[tuple[str, str, str, int]]:
        """(subject, priced limit, currency, minor units) charged by events of
        ``[since_us, until_us)`` (None: unbounded), from the spend rollups
        (voids and cancels taken away); sorted. ``zoned`` gives subjects a
        range of their own (their local month: each hour in the month its
        start falls in), the others keep ``[since_us, until_us)``."""
        rollups = ROLLUPS.c
        query = (
            select(
                rollups.subject,
                rollups.limit_name,
                rollups.value,
                func.sum(rollups.used),
            )
            .where(rollups.dimension == SPEND_DIMENSION)
            .group_by(rollups.subject, rollups.limit_name, rollups.value)
            .order_by(rollups.subject, rollups.value, rollups.limit_name)
        )
        hour, who = rollups.hour_start_us, rollups.subject
        in_range: list[ColumnElement[bool]] = []
        if since_us is not None:
            in_range.append(hour >= since_us)
        if until_us is not None:
            in_range.append(hour < until_us)
        if zoned:
            own = [s for subjects in zoned.values() for s in subjects]
            query = query.where(
                or_(
                    and_(who.not_in(own), *in_range),
                    *(
                        and_(who.in_(list(subjects)), hour >= start, hour < end)
                        for (start, end), subjects in zoned.items()
                    ),
                )
            )
        elif in_range:
            query = query.where(*in_range)
        if subject is not None:
            query = query.where(rollups.subject == subject)
        return [
            (str(s), str(name), str(currency), int(amount))
            for s, name, currency, amount in self.connection.execute(query)
        ]
