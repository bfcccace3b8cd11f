"""The rollup rules (`metering.domain.rollups`) and a limit's dimensions, with plain values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from metering import Limit
from metering.domain.rollups import (
    HOUR_US,
    MAX_VALUE_CHARS,
    NO_VALUE,
    dimension_value,
    hour_start_us,
    rollup_deltas,
    rollup_rows,
)
from metering.errors import InvalidLimit
from metering.limits.files import load_limits_file
from metering.storage.results import ResultRecord

DIMENSIONS = {"api": ("route", "model"), "org": ("route",)}
AT_US = 1_795_000_000_000_000 + 1234  # not on the hour


def record(outcome: str, charges: list[tuple[str, str, int]], metadata: Any, at_us: int = AT_US):
    rows = [[s, name, cost, outcome != "denied", outcome] for s, name, cost in charges]
    return ResultRecord("e", outcome, "", at_us, at_us, (), None, rows, metadata)


@pytest.mark.parametrize(
    ("metadata", "value"),
    [
        (None, NO_VALUE),
        ({}, NO_VALUE),
        ({"route": None}, NO_VALUE),
        ({"route": ""}, NO_VALUE),
        ({"route": "/v1/x"}, "/v1/x"),
        ({"route": 3}, "3"),
        ({"route": 2.5}, "2.5"),
        ({"route": True}, "true"),
        ({"route": {"b": 1, "a": "é"}}, '{"a":"é","b":1}'),
        ({"route": "x" * 500}, "x" * MAX_VALUE_CHARS),
        ({"route": "a\x00b"}, "a\\u0000b"),
    ],
)
def test_values_and_placeholders(metadata: Any, value: str) -> None:
    assert dimension_value(metadata, "route") == value


def test_only_consumed_events_count_every_charge_once_per_key() -> None:
    decided = [
        record("allowed", [("s", "api", 2), ("s", "org", 1)], {"route": "/a"}),
        record("overage", [("s", "org", 5)], {"route": "/a", "model": "m"}),
        # denied: a charge of it fit, but nothing was consumed
        record("denied", [("s", "api", 1), ("s", "org", 9)], {"route": "/a"}),
        record("rejected", [], {"route": "/a"}),
        record("allowed", [("s", "plain", 4)], {"route": "/a"}),  # no dimensions
        record("allowed", [("t", "api", 1)], None, AT_US + HOUR_US),
    ]
    hour = hour_start_us(AT_US)
    assert hour % HOUR_US == 0 and 0 <= AT_US - hour < HOUR_US
    assert rollup_deltas(decided, DIMENSIONS) == {
        ("s", "api", "route", hour, "/a"): (2, 1),
        ("s", "api", "model", hour, ""): (2, 1),
        ("s", "org", "route", hour, "/a"): (6, 2),
        ("t", "api", "route", hour + HOUR_US, ""): (1, 1),
        ("t", "api", "model", hour + HOUR_US, ""): (1, 1),
    }
    taken = rollup_deltas(decided[:1], DIMENSIONS, sign=-1)
    assert taken[("s", "api", "route", hour, "/a")] == (-2, -1)
    assert rollup_deltas(decided, {}) == {}


def test_rows_are_sorted_by_key() -> None:
    deltas = {("b", "x", "k", 0, "v"): (1, 1), ("a", "y", "k", 0, "v"): (2, 1)}
    assert [row[0] for row in rollup_rows(deltas)] == ["a", "b"]


def test_a_limits_dimensions() -> None:
    limit = Limit("api", maximum=5, period="1h", dimensions=("route", "model", "route"))
    assert limit.dimensions == ("route", "model")
    assert Limit.from_dict(limit.to_dict()) == limit
    assert limit.to_dict()["dimensions"] == ["route", "model"]
    assert Limit("api", maximum=5, period="1h").dimensions == ()


@pytest.mark.parametrize(
    ("dimensions", "message"),
    [
        ("route", "must be a list"),
        (("",), "must be 1 to 64"),
        (("a b",), "must be 1 to 64"),
        (("x" * 65,), "must be 1 to 64"),
        ((3,), "must be 1 to 64"),
        (("a", "b", "c", "d", "e"), "at most 4 keys"),
    ],
)
def test_bad_dimensions(dimensions: Any, message: str) -> None:
    with pytest.raises(InvalidLimit, match=message) as raised:
        Limit("api", maximum=5, period="1h", dimensions=dimensions)
    assert raised.value.field == "dimensions"


def test_dimensions_from_files(tmp_path: Path) -> None:
    (tmp_path / "limits.yaml").write_text(
        "api:\n  maximum: 5\n  period: 1h\n  dimensions: [route, model]\n"
    )
    (tmp_path / "limits.toml").write_text(
        '[api]\nmaximum = 5\nperiod = "1h"\ndimensions = ["route"]\n'
    )
    [from_yaml] = load_limits_file(tmp_path / "limits.yaml")
    [from_toml] = load_limits_file(tmp_path / "limits.toml")
    assert (from_yaml.dimensions, from_toml.dimensions) == (("route", "model"), ("route",))
    (tmp_path / "bad.yaml").write_text("api:\n  maximum: 5\n  period: 1h\n  dimensions: route\n")
    with pytest.raises(InvalidLimit, match="dimensions"):
        load_limits_file(tmp_path / "bad.yaml")
