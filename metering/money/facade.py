"""`Meter`'s methods for prices, each handed to `metering.money` (a part
of the facade, kept beside its feature)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from metering import money
from metering.domain.money import Price
from metering.storage.database import Database


class PricesFacade:
    """Prices of limits of a `metering.Meter` (spend caps are limits)."""

    database: Database

    def set_price(
        self,
        limit: str,
        per_unit: object | None,
        currency: str,
        effective_from: datetime | None = None,
        *,
        model: str = "per_unit",
        tiers: Sequence[object] = (),
        package: int | None = None,
        per_package: object | None = None,
        flat_fee: object | None = None,
    ) -> Price:
        """Price ``limit`` at ``per_unit`` major units (text, exact) from
        ``effective_from`` on; or by ``model`` (``per_unit`` None):
        ``graduated`` or ``volume`` with ``tiers`` (``"1000:0.01"``, ...,
        ``"inf:0.005"``), ``package`` with ``package`` units at
        ``per_package``; ``flat_fee`` (major units) once a window, with any."""
        tiered = money.Tiered(model, tuple(tiers), package, per_package, flat_fee)
        return money.set_price(self.database, limit, per_unit, currency, effective_from, tiered)

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
