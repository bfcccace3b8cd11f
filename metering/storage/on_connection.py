"""What the query classes of `Store` share: one connection, its dialect, the
dialect's insert and upsert, and the batch sizes that choose a statement's
form (`chunks`, `OnConnection.bulk`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import BigInteger, Connection, Table, bindparam, case, update
from sqlalchemy.dialects import postgresql, sqlite

# Rows per multi-row statement: well under SQLite's 32,766 bound parameters.
CHUNK: Final = 500
# From this many rows on, PostgreSQL gets the array (unnest) form of a
# statement; fewer rows (the synchronous path) use the plain prepared one,
# which is cheaper for a single row.
PG_BULK_ROWS: Final = 16


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class OnConnection:
    """Queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._dialect = connection.dialect.name
        self._postgres = self._dialect == "postgresql"

    def _bulk(self, rows: int) -> bool:
        return self._dialect == "postgresql" and rows >= PG_BULK_ROWS

    def _insert(self, table: Any) -> Any:
        module = postgresql if self._postgres else sqlite
        return module.insert(table)

    def _upsert(
        self,
        table: Table,
        values: Mapping[str, Any],
        key: Sequence[str],
        changed: Iterable[str] | None = None,
    ) -> None:
        """Insert ``values`` as a row of ``table``; a row with the same ``key``
        columns takes the ``changed`` ones (None: every other) instead."""
        statement = self._insert(table).values(values)
        if changed is None:
            changed = [column for column in values if column not in key]
        self.connection.execute(
            statement.on_conflict_do_update(
                index_elements=list(key),
                set_={column: statement.excluded[column] for column in changed},
            )
        )

    def _add_amounts(
        self,
        table: Table,
        key: Sequence[str],
        column: str,
        rows: Sequence[Mapping[str, Any]],
        *,
        floor: int | None = None,
    ) -> None:
        """Add each row's ``column`` to ``table``'s row of the same ``key``
        columns: a positive amount makes the row when it is missing, a
        negative one (taken back) only changes a row that is there, never
        below ``floor`` (None: no bound)."""
        added = [row for row in rows if row[column] > 0]
        if added:
            statement = self._insert(table)
            statement = statement.on_conflict_do_update(
                index_elements=list(key),
                set_={column: table.c[column] + statement.excluded[column]},
            )
            for part in chunks(added):
                self.connection.execute(statement, list(part))
        taken = [row for row in rows if row[column] < 0]
        if taken:
            # Bound parameters named apart from the columns (`b_...`).
            changed = table.c[column] + bindparam("b_delta", type_=BigInteger)
            if floor is not None:
                changed = case((changed < floor, floor), else_=changed)
            statement = (
                update(table)
                .where(*(table.c[name] == bindparam(f"b_{name}") for name in key))
                .values({column: changed})
            )
            self.connection.execute(
                statement,
                [
                    {"b_delta": row[column], **{f"b_{name}": row[name] for name in key}}
                    for row in taken
                ],
            )
