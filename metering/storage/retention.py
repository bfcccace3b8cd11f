"""Deleting rows older than their retention, a chunk per transaction.

Each statement removes at most ``chunk`` rows, so a prune never holds locks
for long or grows one huge transaction; the caller loops until a chunk comes
back short. ``count_*`` answer the dry run with the same conditions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from sqlalchemy import Connection, Table, and_, delete, exists, func, not_, select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from metering.domain.notifications import SETTLED_STATUSES
from metering.domain.rollups import HOUR_US
from metering.storage.rollups import ROLLUPS
from metering.storage.tables import (
    corrections,
    counter_resets,
    rejected_messages,
    results,
    usage_rollups,
    webhook_attempts,
    webhook_deliveries,
    webhook_marks,
    webhook_messages,
)

CHUNK: Final = 10_000
SETTLED: Final = tuple(status.value for status in SETTLED_STATUSES)


# -- what is old enough --------------------------------------------------------


def _old_results(before_us: int) -> ColumnElement[bool]:
    return results.c.decided_at_us < before_us


def _old_corrections(before_us: int) -> ColumnElement[bool]:
    # A correction goes only with its result: while the result is there a
    # void of the event can come again, and must find it.
    result_left = exists().where(results.c.event_id == corrections.c.event_id)
    return and_(corrections.c.created_at_us < before_us, not_(result_left))


def _old_resets(before_us: int) -> ColumnElement[bool]:
    # Older than every result left: no void can be about an event before it.
    return counter_resets.c.reset_at_us < before_us


def _old_rollups(before_us: int) -> ColumnElement[bool]:
    # An hour goes once all of it is older than ``before_us``.
    return usage_rollups.c.hour_start_us <= before_us - HOUR_US


def _old_rejected(before_us: int) -> ColumnElement[bool]:
    return rejected_messages.c.received_at_us < before_us


def _old_deliveries(before_us: int) -> ColumnElement[bool]:
    d = webhook_deliveries.c
    return and_(d.status.in_(SETTLED), d.updated_at_us < before_us)


def _old_messages(before_us: int) -> ColumnElement[bool]:
    # A message goes once no delivery of it is left.
    left = exists().where(webhook_deliveries.c.message_id == webhook_messages.c.id)
    return and_(webhook_messages.c.created_at_us < before_us, not_(left))


def _old_marks(before_us: int) -> ColumnElement[bool]:
    # A mark keeps a window's notifications once each; a window long over
    # with no reset notice still due needs it no more.
    m = webhook_marks.c
    return and_(m.window_end_us < before_us, m.due_at_us.is_(None))


_Old = Callable[[int], ColumnElement[bool]]

# Each table with a retention, and its rows' condition of being old enough.
_TARGETS: Final[dict[str, tuple[Table, _Old]]] = {
    "results": (results, _old_results),
    "corrections": (corrections, _old_corrections),
    "counter_resets": (counter_resets, _old_resets),
    "usage_rollups": (usage_rollups, _old_rollups),
    "rejected_messages": (rejected_messages, _old_rejected),
    "webhook_deliveries": (webhook_deliveries, _old_deliveries),
    "webhook_messages": (webhook_messages, _old_messages),
    "webhook_marks": (webhook_marks, _old_marks),
}


class RetentionStore:
    """Retention queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # -- counting (dry run) ----------------------------------------------------

    def count(self, table: str, before_us: int) -> int:
        source, where = self._target(table, before_us)
        query = select(func.count()).select_from(source).where(where)
        if source is usage_rollups:  # the rows a compaction would leave (`ROLLUPS`)
            r = ROLLUPS.c
            keys = select(r.subject, r.limit_name, r.dimension, r.hour_start_us, r.value)
            old = keys.where(r.hour_start_us <= before_us - HOUR_US).distinct().subquery()
            query = select(func.count()).select_from(old)
        return int(self.connection.execute(query).scalar_one())

    # -- deleting ----------------------------------------------------------------

    def delete_chunk(self, table: str, before_us: int, chunk: int = CHUNK) -> int:
        """Delete up to ``chunk`` old rows of ``table``; returns how many went."""
        if table == "webhook_deliveries":
            return self._delete_deliveries(before_us, chunk)
        source, where = self._target(table, before_us)
        key = source.primary_key.columns.values()
        if len(key) == 1:
            [column] = key
            picked = select(column).where(where).limit(chunk)
            statement = delete(source).where(column.in_(picked.scalar_subquery()))
        elif source is usage_rollups:  # many rows: a chunk at a time, by key
            picked = select(*key).where(where).limit(chunk)
            statement = delete(source).where(tuple_(*key).in_(picked))
        else:  # webhook_marks: a composite key, deleted by the same condition
            statement = delete(source).where(where)
        return int(self.connection.execute(statement).rowcount)

    def _delete_deliveries(self, before_us: int, chunk: int) -> int:
        """Delete a chunk of settled deliveries, then their attempts.

        One statement picks and deletes, and its condition is checked again
        on each row as it is deleted: a delivery that ``webhooks replay``
        made pending meanwhile stays (with its attempts).
        """
        d = webhook_deliveries.c
        old = _old_deliveries(before_us)
        picked = select(d.id).where(old).limit(chunk).scalar_subquery()
        statement = delete(webhook_deliveries).where(d.id.in_(picked), old).returning(d.id)
        ids = list(self.connection.execute(statement).scalars())
        if ids:
            self.connection.execute(
                delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(ids))
            )
        return len(ids)

    def _target(self, table: str, before_us: int) -> tuple[Table, ColumnElement[bool]]:
        try:
            source, old = _TARGETS[table]
        except KeyError:
            raise ValueError(f"no retention for table {table!r}") from None
        return source, old(before_us)
