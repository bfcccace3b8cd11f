"""Spend rollups, and what cancels and commits of more change in the rollups
(`metering.domain.rollups`), with plain ledger rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metering.domain.rollups import (
    HOUR_US,
    SPEND_DIMENSION,
    charged_more_deltas,
    merged,
    spend_deltas,
    spend_given_back,
    spend_kept,
)

HOUR = 500_000 * HOUR_US
AT_US = HOUR + 1234  # not on the hour
DIMENSIONS = {"api": ("route", "model"), "org": ("route",)}


@dataclass(frozen=True)
class Event:
    outcome: str
    charges: Sequence[Sequence[Any]]
    metadata: Mapping[str, Any] | None = field(default_factory=lambda: {"route": "/a"})
    occurred_at_us: int = AT_US


def row(
    subject: str, name: str, cost: int, outcome: str = "allowed", price: Any = None, *more: Any
) -> list[Any]:
    head = [subject, name, cost, outcome != "denied", outcome, cost, 0, 10, 0, None, AT_US, None]
    if price is None and not more:
        return head
    return [*head, [], price, *more]


def test_priced_consumed_charges_add_their_amounts_in_the_events_hour() -> None:
    decided = [
        Event("allowed", [row("s", "api", 2, "allowed", ["EUR", 150]), row("s", "org", 1)]),
        Event("overage", [row("s", "api", 1, "overage", ["EUR", 70])]),
        Event("denied", [row("s", "api", 1, "denied", ["EUR", 1000])]),
        Event(
            "allowed", [row("s", "api", 1, "allowed", ["USD", 9])], occurred_at_us=AT_US + HOUR_US
        ),
        Event("allowed", [row("s", "api", 1, "would_deny", ["EUR", 3000])]),
        # an overdraft follows a null price: no spend
        Event("allowed", [row("s", "org", 5, "allowed", None, 2)]),
        # grants that paid, and no price after them
        Event("allowed", [[*row("s", "api", 1)[:12], [["g", 1]]]]),
    ]
    assert spend_deltas(decided) == {
        ("s", "api", SPEND_DIMENSION, HOUR, "EUR"): (220, 2),
        ("s", "api", SPEND_DIMENSION, HOUR + HOUR_US, "USD"): (9, 1),
    }
    assert spend_deltas(decided, sign=-1) == {
        ("s", "api", SPEND_DIMENSION, HOUR, "EUR"): (-220, -2),
        ("s", "api", SPEND_DIMENSION, HOUR + HOUR_US, "USD"): (-9, -1),
    }


def test_a_cancel_takes_back_the_spend_of_charges_returned_whole() -> None:
    event = Event(
        "allowed",
        [
            row("s", "api", 3, "allowed", ["EUR", 300]),
            row("s", "web", 3, "allowed", ["EUR", 40]),
            row("t", "api", 2, "allowed", ["EUR", 20]),
            row("s", "org", 2),
            row("u", "api", 0, "allowed", ["EUR", 0]),
            row("v", "org", 2, "allowed", None, 1),
        ],
    )
    returned = [
        ("s", "api", 3, 3),
        ("s", "web", 3, 2),
        ("t", "api", 2, 5),
        ("s", "org", 2, 2),
        ("u", "api", 0, 0),
        ("v", "org", 2, 2),
    ]
    assert spend_given_back(event, returned) == {
        ("s", "api", SPEND_DIMENSION, HOUR, "EUR"): (-300, -1),
        ("t", "api", SPEND_DIMENSION, HOUR, "EUR"): (-20, -1),
        # A charge of 0 given back whole (a void of a seat its value keeps): its event leaves.
        ("u", "api", SPEND_DIMENSION, HOUR, "EUR"): (0, -1),
    }


def test_a_cancel_sums_charges_of_one_key() -> None:
    event = Event(
        "allowed",
        [row("s", "api", 1, "allowed", ["EUR", 5]), row("s", "api", 1, "allowed", ["EUR", 7])],
    )
    assert spend_given_back(event, [("s", "api", 1, 1)]) == {
        ("s", "api", SPEND_DIMENSION, HOUR, "EUR"): (-12, -2),
    }


def test_a_cancel_of_a_charge_grants_paid_takes_no_spend_back() -> None:
    event = Event("allowed", [[*row("s", "api", 1)[:12], [["g", 1]]]])
    assert spend_given_back(event, [("s", "api", 1, 1)]) == {}


def test_a_would_be_denial_leaves_the_events_other_priced_charges_counted() -> None:
    event = Event(
        "allowed",
        [
            row("s", "api", 1, "would_deny", ["EUR", 3000]),
            row("t", "api", 1, "allowed", ["EUR", 5]),
        ],
    )
    assert spend_deltas([event]) == {("t", "api", SPEND_DIMENSION, HOUR, "EUR"): (5, 1)}


def test_merged_sums_key_by_key() -> None:
    a = {("s", "api", "route", HOUR, "/a"): (2, 1), ("s", "api", "route", HOUR, "/b"): (1, 1)}
    b = {("s", "api", "route", HOUR, "/a"): (3, -1)}
    c = {("t", "api", "route", HOUR, "/a"): (4, 2)}
    assert merged(a, b, c) == {
        ("s", "api", "route", HOUR, "/a"): (5, 0),
        ("s", "api", "route", HOUR, "/b"): (1, 1),
        ("t", "api", "route", HOUR, "/a"): (4, 2),
    }
    assert merged() == {}


def test_a_commit_of_more_adds_the_extra_units_but_no_event() -> None:
    event = Event("allowed", [], {"route": "/a", "model": "m"})
    extra = [
        ("s", "api", 2),
        ("s", "org", 1),
        ("s", "org", 3),
        ("s", "api", 0),
        ("u", "org", 0),
        ("s", "plain", 5),
        ("t", "org", -1),
        ("t", "api", 2),
    ]
    assert charged_more_deltas(event, extra, DIMENSIONS) == {
        ("s", "api", "route", HOUR, "/a"): (2, 0),
        ("s", "api", "model", HOUR, "m"): (2, 0),
        ("s", "org", "route", HOUR, "/a"): (4, 0),
        ("t", "api", "route", HOUR, "/a"): (2, 0),
        ("t", "api", "model", HOUR, "m"): (2, 0),
    }
    assert charged_more_deltas(event, [("s", "api", 1)], {}) == {}
    no_metadata = Event("allowed", [], None)
    assert charged_more_deltas(no_metadata, [("s", "org", 1)], DIMENSIONS) == {
        ("s", "org", "route", HOUR, ""): (1, 0),
    }


def test_a_commit_of_fewer_priced_units_takes_back_the_money_not_kept() -> None:
    event = Event("allowed", [])
    kept = [
        ("s", "api", "USD", 60, 20, False),  # some units stay: the event stays
        ("s", "api", "USD", 10, 10, False),  # nothing changes
        ("s", "org", "EUR", 30, 0, True),  # none stays: the event goes too
        ("t", "org", "EUR", 0, 0, True),
    ]
    assert spend_kept(event, kept) == {
        ("s", "api", SPEND_DIMENSION, HOUR, "USD"): (-40, 0),
        ("s", "org", SPEND_DIMENSION, HOUR, "EUR"): (-30, -1),
        ("t", "org", SPEND_DIMENSION, HOUR, "EUR"): (0, -1),
    }
    twice = [("s", "api", "USD", 60, 20, False), ("s", "api", "USD", 30, 0, True)]
    assert spend_kept(event, twice) == {("s", "api", SPEND_DIMENSION, HOUR, "USD"): (-70, -1)}
