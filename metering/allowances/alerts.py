"""Per-subject alert thresholds (`metering.domain.alerts`): set, list, remove.

A subject's own thresholds replace its limit's for ``limit.threshold``
notices. The hot paths leave such subjects to the general engine, which
reads them with the subject's counters (`metering.engine.reference`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection

from metering.domain.alerts import parse_points, shown_points
from metering.domain.events import validate_filters, validate_subject
from metering.domain.instants import from_us
from metering.domain.jsonable import fields_dict
from metering.domain.limits import validate_limit_name
from metering.errors import UnknownLimit
from metering.storage.alerts import AlertRecord, AlertStore
from metering.storage.database import Database
from metering.storage.store import Store

# `Alert.to_dict`'s keys, in order.
ALERT_KEYS: Final = ("subject", "limit", "at", "thresholds", "thresholds_units", "updated_at")


@dataclass(frozen=True, slots=True)
class Alert:
    """One subject's thresholds for one limit."""

    subject: str
    limit: str
    thresholds: tuple[int, ...]
    thresholds_units: tuple[int, ...]
    updated_at: datetime

    @property
    def at(self) -> list[str]:
        return shown_points(self.thresholds, self.thresholds_units)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, ALERT_KEYS)


def _alert(record: AlertRecord) -> Alert:
    return Alert(
        record.subject,
        record.limit,
        record.thresholds,
        record.thresholds_units,
        from_us(record.created_at_us),
    )


def set_alert(database: Database, subject: str, limit: str, at: Iterable[object]) -> Alert:
    """Replace ``limit``'s thresholds for ``subject`` by ``at`` (``"80%"``, ``5000`` ...)."""
    validate_subject(subject)
    validate_limit_name(limit)
    percents, units = parse_points(at)
    record = AlertRecord(subject, limit, percents, units, database.now_us())

    def work(connection: Connection) -> Alert:
        if limit not in Store(connection).load_limits([limit]):
            raise UnknownLimit(limit)
        AlertStore(connection).put(record)
        return _alert(record)

    return database.run(work)


def list_alerts(
    database: Database, subject: str | None = None, limit: str | None = None
) -> list[Alert]:
    validate_filters(subject, limit)
    return [_alert(r) for r in database.run(lambda c: AlertStore(c).listed(subject, limit))]


def remove_alert(database: Database, subject: str, limit: str) -> bool:
    """Back to the limit's thresholds; False if the subject had none of its own.
    `UnknownLimit` when it had none and no such limit exists (an alert that
    outlived its limit can still be removed)."""
    validate_subject(subject)
    validate_limit_name(limit)

    def work(connection: Connection) -> bool:
        if AlertStore(connection).remove(subject, limit):
            return True
        if limit not in Store(connection).load_limits([limit]):
            raise UnknownLimit(limit)
        return False

    return database.run(work)


__all__ = ["Alert", "list_alerts", "remove_alert", "set_alert"]
