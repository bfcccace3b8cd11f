"""Rows to records and back: one mapping of a record's fields to its columns.

A record (a dataclass) is stored one field (of those its constructor
takes) a column, in the column of the same name unless ``columns`` renames
it; ``read`` and ``write`` convert a field's value from and to what its
column holds (JSON text, an enum's value). Everything is worked out once,
when the mapping is made: reading a row is one C-level ``attrgetter`` call
and the record's constructor, with no reflection per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from operator import attrgetter
from typing import Any, Generic, TypeVar

R = TypeVar("R")

Convert = Callable[[Any], Any]


class RecordColumns(Generic[R]):
    """How records of one dataclass are stored: its fields, in order, and
    the column each is stored in."""

    def __init__(
        self,
        record: type[R],
        *,
        columns: Mapping[str, str] | None = None,
        read: Mapping[str, Convert] | None = None,
        write: Mapping[str, Convert] | None = None,
    ) -> None:
        columns, read, write = columns or {}, read or {}, write or {}
        names = tuple(f.name for f in fields(record) if f.init)  # type: ignore[arg-type]
        unknown = (set(columns) | set(read) | set(write)) - set(names)
        if unknown:
            raise ValueError(f"{record.__name__} has no field {sorted(unknown)}")
        self.record = record
        # The column of each field, in the fields' order.
        self.columns = tuple(columns.get(name, name) for name in names)
        self._get = attrgetter(*self.columns)
        self._read = tuple((i, read[name]) for i, name in enumerate(names) if name in read)
        self._write = tuple(
            (column, attrgetter(name), write.get(name))
            for name, column in zip(names, self.columns, strict=True)
        )

    def of_row(self, row: Any) -> R:
        """The record of a row whose values are named by column (a SQLAlchemy row)."""
        values = self._get(row)
        return self.record(*values) if not self._read else self.of_values(values)

    def of_values(self, values: Iterable[Any]) -> R:
        """The record of a row's values in the fields' order (a driver's tuple)."""
        if not self._read:
            return self.record(*values)
        found = list(values)
        for i, convert in self._read:
            found[i] = convert(found[i])
        return self.record(*found)

    def values(self, record: R) -> dict[str, Any]:
        """The record's row: each column's value."""
        return {
            column: value if convert is None else convert(value)
            for column, get, convert in self._write
            for value in (get(record),)
        }
