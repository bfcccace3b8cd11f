"""`metering.domain.jsonable`: the rule behind the records' ``to_dict``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

import pytest

from metering.domain.jsonable import encoder, field_names, fields_dict, json_value

AT = datetime(2026, 11, 26, 12, 30, tzinfo=UTC)


class Line(NamedTuple):
    line: int
    reason: str


@dataclass(frozen=True)
class Inner:
    name: str

    def to_dict(self) -> dict[str, str]:
        return {"inner": self.name}


@dataclass(frozen=True)
class Record:
    zeta: int
    alpha: str | None
    at: datetime | None
    tags: tuple[str, ...]
    parts: tuple[Inner, ...]
    ratio: float = 0.5
    flag: bool = True

    @property
    def doubled(self) -> int:
        return 2 * self.zeta


def test_field_names_of_a_dataclass_and_a_named_tuple_keep_the_declared_order() -> None:
    assert field_names(Record) == ("zeta", "alpha", "at", "tags", "parts", "ratio", "flag")
    assert field_names(Line) == ("line", "reason")


def test_json_value_converts_instants_tuples_and_records_and_keeps_the_rest() -> None:
    assert json_value(AT) == "2026-11-26T12:30:00+00:00"
    assert json_value((AT, 1, (2, "x"))) == ["2026-11-26T12:30:00+00:00", 1, [2, "x"]]
    assert json_value(Inner("a")) == {"inner": "a"}
    for value in (None, 0, 7, -1.5, "text", "", True, False):
        assert json_value(value) is value
    listed = [1, 2]
    assert json_value(listed) is listed
    mapping = {"k": AT}
    assert json_value(mapping) is mapping


def test_fields_dict_takes_every_field_in_order_by_default() -> None:
    record = Record(3, None, AT, ("a", "b"), (Inner("x"),))
    found = fields_dict(record)
    assert list(found) == ["zeta", "alpha", "at", "tags", "parts", "ratio", "flag"]
    assert found == {
        "zeta": 3,
        "alpha": None,
        "at": "2026-11-26T12:30:00+00:00",
        "tags": ["a", "b"],
        "parts": [{"inner": "x"}],
        "ratio": 0.5,
        "flag": True,
    }
    json.dumps(found)


def test_fields_dict_takes_the_names_given_in_their_order_properties_too() -> None:
    record = Record(3, "z", None, (), ())
    found = fields_dict(record, ("doubled", "alpha", "at", "tags"))
    assert list(found.items()) == [("doubled", 6), ("alpha", "z"), ("at", None), ("tags", [])]
    assert fields_dict(record, ()) == {}
    assert fields_dict(Line(4, "no event")) == {"line": 4, "reason": "no event"}


def test_an_encoder_writes_what_json_dumps_writes() -> None:
    value = {"b": [1, 2.5, None, True, float("inf")], "a": 'é\u2028"x', 3: {}, "c": ()}
    assert encoder()(value) == json.dumps(value)  # keys in their order, ASCII only
    assert encoder(",", ":")(value) == json.dumps(value, separators=(",", ":"))
    assert encoder(";", "=")(["x", {"k": 1}]) == '["x";{"k"=1}]'
    with pytest.raises(ValueError, match="Out of range float values"):
        encoder(allow_nan=False)(value)
    assert encoder(allow_nan=False)([1.5]) == "[1.5]"
    with pytest.raises(TypeError, match="is not JSON serializable"):
        encoder()({"when": object()})
    with pytest.raises(TypeError, match="keys must be"):
        encoder()({(1, 2): "pair"})


def test_an_encoder_writes_a_long_value_whole() -> None:
    # (the C encoder hands a long value back in several pieces)
    value = {"ids": list(range(60_000))}
    assert encoder(",", ":")(value) == json.dumps(value, separators=(",", ":"))
