"""Records as JSON: the one rule behind the ``to_dict`` of value objects.

A record (a dataclass, or a named tuple) becomes a dict of its attributes, in
the order given (by default its fields' order, so JSON keys keep the order
the record declares). Each value is made ready for `json.dumps`: an instant
as ISO 8601 text, a tuple as a list of such values, a value with a
``to_dict`` of its own as that; anything else as it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import fields
from datetime import datetime
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
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


def encoder(
    item_separator: str = ", ", key_separator: str = ": ", *, allow_nan: bool = True
) -> Callable[[object], str]:
    """`json.dumps` with these separators (and ``allow_nan``; its other
    defaults): the standard library's C encoder made once, where
    ``json.dumps`` makes one per call, which is most of its cost for a short
    value. What it cannot encode raises as ``json.dumps`` does (`TypeError`,
    `ValueError`), but a circular value `RecursionError`: it has no check."""
    fallback = json.JSONEncoder(separators=(item_separator, key_separator), allow_nan=allow_nan)
    if c_make_encoder is None:  # pragma: no cover - CPython has it
        return fallback.encode
    iterencode = c_make_encoder(
        None,  # no circular check: see above
        fallback.default,
        encode_basestring_ascii,
        None,
        key_separator,
        item_separator,
        False,
        False,
        allow_nan,
    )
    join = "".join
    return lambda value: join(iterencode(value, 0))
