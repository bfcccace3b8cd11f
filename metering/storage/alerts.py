"""Per-subject alert thresholds in SQL (`metering.allowances.alerts`).

A row replaces one limit's thresholds (percentages and amounts) for one
subject. Setting or removing one bumps the limits' version, so every
process's `LimitCache` learns which subjects have their own, and with
which thresholds (the fast path announces them as the general engine does;
the one-trip function leaves them to it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from sqlalchemy import delete, select, tuple_

from metering.storage.counters import Pair
from metering.storage.limits import BUMP_LIMITS_VERSION
from metering.storage.on_connection import OnConnection
from metering.storage.records import RecordColumns
from metering.storage.tables import alert_thresholds


@dataclass(frozen=True, slots=True)
class AlertRecord:
    """One subject's thresholds for one limit."""

    subject: str
    limit: str
    thresholds: tuple[int, ...]
    thresholds_units: tuple[int, ...]
    created_at_us: int


def _json_tuple(text: str) -> tuple[int, ...]:
    return tuple(json.loads(text))


def _json_list(values: tuple[int, ...]) -> str:
    return json.dumps(list(values))


_ALERT: Final = RecordColumns(
    AlertRecord,
    columns={"limit": "limit_name"},
    read={"thresholds": _json_tuple, "thresholds_units": _json_tuple},
    write={"thresholds": _json_list, "thresholds_units": _json_list},
)


# Every alert's thresholds (what the hot path's cache reads), built once.
_LIST_ALERTS: Final = select(alert_thresholds).order_by(
    alert_thresholds.c.limit_name, alert_thresholds.c.subject
)


class AlertStore(OnConnection):
    """Statements on one connection; the caller owns the transaction."""

    def put(self, record: AlertRecord) -> None:
        self._upsert(alert_thresholds, _ALERT.values(record), key=["limit_name", "subject"])
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
        query = _LIST_ALERTS
        if subject is not None:
            query = query.where(a.subject == subject)
        if limit is not None:
            query = query.where(a.limit_name == limit)
        return [_ALERT.of_row(row) for row in self.connection.execute(query)]

    def of(self, pairs: Iterable[Pair]) -> dict[Pair, AlertRecord]:
        """The thresholds of ``pairs`` that have their own."""
        wanted = sorted(set(pairs))
        if not wanted:
            return {}
        a = alert_thresholds.c
        query = select(alert_thresholds).where(tuple_(a.limit_name, a.subject).in_(wanted))
        return {
            (record.limit, record.subject): record
            for record in map(_ALERT.of_row, self.connection.execute(query))
        }


__all__ = ["AlertRecord", "AlertStore"]
