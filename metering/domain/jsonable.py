"""Records as JSON: the one rule behind the ``to_dict`` of value objects.

A record (a dataclass, or a named tuple) becomes a dict of its attributes, in
the order given (by default its fields' order, so JSON keys keep the order
the record declares). Each value is made ready for `json.dumps`: an instant
as ISO 8601 text, a tuple as a list of such values, a value with a
``to_dict`` of its own as that; anything else as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from datetime import datetime
from typing import Any


def field_names(kind: type) -> tuple[str, ...]:
    """The fields of a dataclass or a named tuple ``kind``, in declared order."""
    named: tuple[str, ...] | None = getattr(kind, "_fields", None)
    if named is not None:
        return named
    return tuple(f.name for f in fields(kind))


def json_value(value: object) -> Any:
    """``value`` ready for `json.dumps` (see the module)."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [json_value(item) for item in value]
    to_dict = getattr(value, "to_dict", None)
    if to_dict is not None:
        return to_dict()
    return value


def fields_dict(record: object, names: Iterable[str] | None = None) -> dict[str, Any]:
    """``record``'s attributes ``names`` (default: all its fields) as JSON-ready values."""
    chosen = field_names(type(record)) if names is None else names
    return {name: json_value(getattr(record, name)) for name in chosen}
