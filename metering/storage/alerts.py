"""Per-subject alert thresholds in SQL (`metering.alerts`).

A row replaces one limit's thresholds (percentages and amounts) for one
subject. Setting or removing one bumps the limits' version, so every
process's `LimitCache` learns which subjects have their own (the hot paths
leave those to the general engine, which announces them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite

from metering.storage.counters import Pair
from metering.storage.limits import BUMP_LIMITS_VERSION
from metering.storage.tables import alert_thresholds


@dataclass(frozen=True, slots=True)
class AlertRecord:
    """One subject's thresholds for one limit."""

    subject: str
    limit: str
    thresholds: tuple[int, ...]
    thresholds_units: tuple[int, ...]
    created_at_us: int


def _record(row: Any) -> AlertRecord:
    return AlertRecord(
        row.subject,
        row.limit_name,
        tuple(json.loads(row.thresholds)),
        tuple(json.loads(row.thresholds_units)),
        row.created_at_us,
    )


class AlertStore:
    """Statements on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._postgres = connection.dialect.name == "postgresql"

    def put(self, record: AlertRecord) -> None:
        values = {
            "limit_name": record.limit,
            "subject": record.subject,
            "thresholds": json.dumps(list(record.thresholds)),
            "thresholds_units": json.dumps(list(record.thresholds_units)),
            "created_at_us": record.created_at_us,
        }
        statement = (postgresql if self._postgres else sqlite).insert(alert_thresholds)
        statement = statement.values(values)
        self.connection.execute(
            statement.on_conflict_do_update(
                index_elements=["limit_name", "subject"],
                set_={
                    "thresholds": statement.excluded.thresholds,
                    "thresholds_units": statement.excluded.thresholds_units,
                    "created_at_us": statement.excluded.created_at_us,
                },
            )
        )
        self.connection.execute(BUMP_LIMITS_VERSION)

    def remove(self, subject: str, limit: str) -> bool:
        a = alert_thresholds.c
        found = self.connection.execute(
            delete(alert_thresholds).where(a.subject == subject, a.limit_name == limit)
        )
        if found.rowcount:
            self.connection.execute(BUMP_LIMITS_VERSION)
        return bool(found.rowcount)

    def listed(self, subject: str | None = None, limit: str | None = None) -> list[AlertRecord]:
        a = alert_thresholds.c
        query = select(alert_thresholds)
        if subject is not None:
            query = query.where(a.subject == subject)
        if limit is not None:
            query = query.where(a.limit_name == limit)
        query = query.order_by(a.limit_name, a.subject)
        return [_record(row) for row in self.connection.execute(query)]

    def pairs(self) -> set[Pair]:
        """Every (limit, subject) with thresholds of its own."""
        a = alert_thresholds.c
        return {(n, s) for n, s in self.connection.execute(select(a.limit_name, a.subject))}

    def of(self, pairs: Iterable[Pair]) -> dict[Pair, AlertRecord]:
        """The thresholds of ``pairs`` that have their own."""
        wanted = sorted(set(pairs))
        if not wanted:
            return {}
        a = alert_thresholds.c
        query = select(alert_thresholds).where(tuple_(a.limit_name, a.subject).in_(wanted))
        return {
            (record.limit, record.subject): record
            for record in map(_record, self.connection.execute(query))
        }


__all__ = ["AlertRecord", "AlertStore"]
