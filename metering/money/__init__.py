"""Prices and spend caps: the money service (`Meter` wraps it).

The rules (currencies, rounding, prices in force) are in
`metering.domain.money`; deciding a priced charge is the reference engine's
(`metering.engine.money`); the SQL is in `metering.storage.prices`.
"""

from metering.money.service import (
    Tiered,
    prices,
    remove_price,
    set_price,
)

__all__ = ["Tiered", "prices", "remove_price", "set_price"]
