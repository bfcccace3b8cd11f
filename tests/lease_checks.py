"""What the ledger says a key used, to hold counters to it (the lease tests).

A key's settled usage in the ledger is the cost of its allowed events (a
lease's block is one event, recorded as a reservation of the whole block)
less what their reservations gave back when they were settled.
"""

from __future__ import annotations

import json

from sqlalchemy import select

from metering import Meter
from metering.storage.tables import results


def settled_usage(meter: Meter, subject: str, limit: str) -> int:
    """Units of (subject, limit) allowed in the ledger, less what went back."""
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(select(results.c.outcome, results.c.charges)).all()
    charged = sum(
        int(charge[2])
        for outcome, charges in rows
        if outcome in ("allowed", "overage")
        for charge in json.loads(charges)
        if charge[0] == subject and charge[1] == limit
    )
    back = sum(
        info.given_back_of(charge)
        for info in meter.reservations(subject=subject, count=10_000)
        for charge in info.charges
        if charge.limit == limit
    )
    return charged - back


def counted(meter: Meter, subject: str, limit: str) -> int:
    """The key's current counter (0 when it has none)."""
    return sum(c.used for c in meter.counters(subject, limit))
