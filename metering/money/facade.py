"""`Meter`'s methods for prices, each handed to `metering.money` (a part
of the facade, kept beside its feature)."""

from __future__ import annotations

from datetime import datetime

from metering import money
from metering.domain.money import Price
from metering.storage.database import Database


class PricesFacade:
    """Prices of limits of a `metering.Meter` (spend caps are limits)."""

    database: Database

    def set_price(
        self, limit: str, per_unit: object, currency: str, effective_from: datetime | None = None
    ) -> Price:
        """Price ``limit`` at ``per_unit`` major units (text, exact) from ``effective_from`` on."""
        return money.set_price(self.database, limit, per_unit, currency, effective_from)

    def remove_price(
        self,
        limit: str,
        currency: str,
        effective_from: datetime | None = None,
    ) -> Price:
        """End ``limit``'s price from ``effective_from`` (default: now) on."""
        return money.remove_price(self.database, limit, currency, effective_from)

    def prices(self, limit: str | None = None) -> list[Price]:
        return money.prices(self.database, limit)
