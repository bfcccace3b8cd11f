"""Usage by dimension's rules (`domain/rollups.py`) to the unit: the UTC hour of
an event, a dimension value's text, which charges are rolled up, what a
cancelled reservation takes back, and the rows' order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from metering.domain.instants import to_us
from metering.domain.rollups import (
    dimension_value,
    given_back_deltas,
    hour_start_us,
    rollup_deltas,
    rollup_rows,
    shown_value,
)

SECOND = 1_000_000
NOW_US = to_us(datetime(2026, 11, 23, 12, 0, tzinfo=UTC))


@dataclass(frozen=True)
class Decided:
    outcome: str
    occurred_at_us: int
    charges: list[list[object]]
    metadata: dict[str, object] | None


HOUR = 3_600 * SECOND
AT = NOW_US + 17 * 60 * SECOND + 5  # 12:17 and 5 µs


def charge_row(subject: str, name: str, cost: int, outcome: str = "allowed") -> list[object]:
    return [subject, name, cost, outcome != "denied", outcome, 0, 0, 10, 0, None, 0, None]


def test_usage_counts_in_the_utc_hour_of_the_event() -> None:
    assert hour_start_us(AT) == NOW_US
    assert hour_start_us(NOW_US) == NOW_US
    assert hour_start_us(NOW_US - 1) == NOW_US - HOUR


@pytest.mark.parametrize(
    ("metadata", "value"),
    [
        (None, ""),
        ({}, ""),
        ({"route": None}, ""),
        ({"route": ""}, ""),
        ({"route": "/v1/é"}, "/v1/é"),
        ({"route": 3}, "3"),
        ({"route": 2.5}, "2.5"),
        ({"route": True}, "true"),
        ({"route": ["a", 1]}, '["a",1]'),
        ({"route": {"b": 1, "a": "é"}}, '{"a":"é","b":1}'),
        ({"route": "x" * 250}, "x" * 200),
        ({"route": "a\x00b"}, "a\\u0000b"),
        ({"other": "x"}, ""),
    ],
)
def test_a_dimension_value_is_the_text_or_compact_json_cut_to_200(
    metadata: dict[str, object] | None, value: str
) -> None:
    assert dimension_value(metadata, "route") == value


def test_a_missing_value_is_shown_as_none() -> None:
    assert shown_value("") == "(none)"
    assert shown_value("/v1") == "/v1"


def test_only_consumed_charges_of_dimensioned_limits_are_rolled_up() -> None:
    dimensions = {"api": ("route", "model"), "org": ("route",)}
    shadowed = [charge_row("s", "api", 5, "would_deny"), charge_row("o", "org", 2)]
    events = [
        Decided("denied", AT, [charge_row("s", "api", 9)], None),  # a denied event: none
        Decided("allowed", AT, [charge_row("s", "api", 3), charge_row("o", "org", 1)], None),
        Decided("rejected", AT, [], None),
        Decided("overage", AT + HOUR, [charge_row("s", "api", 2)], {"route": "/a", "model": 7}),
        Decided("allowed", AT, [charge_row("s", "api", 4)], {"route": None}),
        Decided("allowed", AT, shadowed, None),  # the shadow's would-deny consumed nothing
        Decided("allowed", AT, [charge_row("s", "plain", 6)], None),
    ]
    assert rollup_deltas(events, dimensions) == {
        ("s", "api", "route", NOW_US, ""): (7, 2),
        ("s", "api", "model", NOW_US, ""): (7, 2),
        ("o", "org", "route", NOW_US, ""): (3, 2),
        ("s", "api", "route", NOW_US + HOUR, "/a"): (2, 1),
        ("s", "api", "model", NOW_US + HOUR, "7"): (2, 1),
    }
    assert rollup_deltas(events[:2], dimensions, sign=-1) == {
        ("s", "api", "route", NOW_US, ""): (-3, -1),
        ("s", "api", "model", NOW_US, ""): (-3, -1),
        ("o", "org", "route", NOW_US, ""): (-1, -1),
    }
    assert rollup_deltas(events, {}) == {}
    assert rollup_deltas(events, {"other": ("route",)}) == {}


def test_a_cancelled_reservation_takes_back_its_units_and_a_wholly_returned_event() -> None:
    event = Decided("allowed", AT, [], {"route": "/r"})
    dimensions = {"api": ("route",), "org": ("route", "model")}
    returned = [("t", "api", 1, 0), ("s", "api", 5, 2), ("o", "org", 3, 3), ("s", "none", 4, 4)]
    assert given_back_deltas(event, returned, dimensions) == {
        ("s", "api", "route", NOW_US, "/r"): (-2, 0),
        ("o", "org", "route", NOW_US, "/r"): (-3, -1),
        ("o", "org", "model", NOW_US, ""): (-3, -1),
    }
    twice = [("s", "api", 5, 2), ("s", "api", 1, 1), ("s", "api", 2, 3)]
    assert given_back_deltas(event, twice, dimensions) == {
        ("s", "api", "route", NOW_US, "/r"): (-6, -2)
    }
    assert given_back_deltas(event, [("s", "api", 5, -1)], dimensions) == {}
    assert given_back_deltas(event, [("s", "api", 3, 1)], dimensions) == {
        ("s", "api", "route", NOW_US, "/r"): (-1, 0)
    }
    # A charge of 0 given back whole (a void of a seat its value keeps): the event leaves.
    assert given_back_deltas(event, [("s", "api", 0, 0)], dimensions) == {
        ("s", "api", "route", NOW_US, "/r"): (0, -1)
    }


def test_rollup_rows_come_sorted_by_key() -> None:
    deltas = {
        ("s", "b", "k", 2, "v"): (1, 1),
        ("s", "a", "k", 9, "v"): (2, 1),
        ("r", "z", "k", 1, "v"): (3, -1),
    }
    assert rollup_rows(deltas) == [
        ("r", "z", "k", 1, "v", 3, -1),
        ("s", "a", "k", 9, "v", 2, 1),
        ("s", "b", "k", 2, "v", 1, 1),
    ]


def test_a_value_with_a_nul_is_rolled_up_escaped() -> None:
    events = [Decided("allowed", AT, [charge_row("s", "api", 1)], {"route": "/a\x00b"})]
    assert rollup_deltas(events, {"api": ("route",)}) == {
        ("s", "api", "route", NOW_US, "/a\\u0000b"): (1, 1)
    }
