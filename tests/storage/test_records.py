"""`RecordColumns`: a record's fields to its columns and back, without a database."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from metering.storage.records import RecordColumns


@dataclass(frozen=True, slots=True)
class Thing:
    id: str
    limit: str
    tags: tuple[str, ...]
    size: int = 0
    derived: int = field(init=False, default=0)


THING = RecordColumns(
    Thing,
    columns={"limit": "limit_name"},
    read={"tags": lambda text: tuple(json.loads(text))},
    write={"tags": lambda tags: json.dumps(list(tags))},
)


def test_a_record_goes_to_its_columns_and_back() -> None:
    thing = Thing("a", "api", ("x", "y"), 3)
    values = THING.values(thing)
    assert values == {"id": "a", "limit_name": "api", "tags": '["x", "y"]', "size": 3}
    assert THING.of_row(SimpleNamespace(**values)) == thing
    assert THING.of_values(values.values()) == thing
    assert THING.columns == ("id", "limit_name", "tags", "size")


def test_a_mapping_naming_no_field_is_refused() -> None:
    with pytest.raises(ValueError, match="no field"):
        RecordColumns(Thing, columns={"limits": "limit_name"})
