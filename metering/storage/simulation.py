"""The backtest's reads: the decided events of a period, oldest first.

Only reads (`metering.simulation` replays them in memory). Events that were
decided (allowed, overage, denied) count; rejected ones charged nothing, and
voided ones (a row in ``corrections``) are left out, as their usage was
reversed. A reservation's result is its event, at its reserved cost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

from sqlalchemy import Connection, and_, exists, func, not_, null, select
from sqlalchemy.sql.elements import ColumnElement

from metering.storage.results import occurred_since
from metering.storage.tables import corrections, results

DECIDED: Final = ("allowed", "overage", "denied")
BATCH: Final = 10_000


def _period(since_us: int, until_us: int) -> ColumnElement[bool]:
    voided = exists().where(corrections.c.event_id == results.c.event_id)
    return and_(
        occurred_since(since_us),
        results.c.occurred_at_us <= until_us,
        results.c.outcome.in_(DECIDED),
        not_(voided),
    )


def count_demand(connection: Connection, since_us: int, until_us: int) -> int:
    """How many events `demand` yields."""
    query = select(func.count()).select_from(results).where(_period(since_us, until_us))
    return int(connection.execute(query).scalar_one())


def demand(
    connection: Connection, since_us: int, until_us: int, *, metadata: bool = False
) -> Iterator[tuple[int, list[list[Any]], dict[str, Any] | None]]:
    """Each event's (occurred_at_us, charge rows, metadata), in event-time order
    (ties by id); its metadata only when asked for (seat limits' values), else None."""
    meta = results.c.metadata if metadata else null()
    query = (
        select(results.c.occurred_at_us, results.c.charges, meta)
        .where(_period(since_us, until_us))
        .order_by(results.c.occurred_at_us, results.c.event_id)
    )
    loads = json.loads
    rows = connection.execution_options(yield_per=BATCH).execute(query)
    for occurred_at_us, charges, found in rows:
        yield occurred_at_us, loads(charges), loads(found) if found else None
