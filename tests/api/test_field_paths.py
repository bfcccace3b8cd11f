"""One convention for the fields a 4xx problem names, on every route that
takes charges: a path into the body as it was sent (``cost``,
``charges[1].cost``, ``events[1].cost``, ``metadata``), never a JSON
pointer. ``POST /v1/check`` and ``POST /v1/events?wait=decision`` name the
same fields for the same faults, on both databases, in process."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PATH = re.compile(r"[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*")
CALLS = {"subject": "org-1", "limit": "calls"}
SEAT = {"subject": "org-1", "limit": "seats"}
# A fault, as a check's body (an event's, with an id) -> the field named.
FAULTS: list[tuple[dict[str, Any], str]] = [
    ({**CALLS, "cost": 0}, "cost"),
    ({"charges": [CALLS, {**CALLS, "cost": 0}]}, "charges[1].cost"),
    (SEAT, "metadata"),
    ({**SEAT, "cost": 2, "metadata": {"user": "ann"}}, "cost"),
    ({"charges": [CALLS, {**SEAT, "cost": 2}], "metadata": {"user": "ann"}}, "charges[1].cost"),
]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=5, period="1h", window="calendar"))
        m.set_limit(Limit("seats", maximum=2, period="1mo", window="calendar", distinct="user"))
        yield m


def fields(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 400, answer.text
    found = [error["field"] for error in answer.json()["errors"]]
    assert all(PATH.fullmatch(field) for field in found), found
    return found


@pytest.mark.parametrize(("body", "field"), FAULTS)
def test_check_and_events_name_a_fault_the_same_way(
    http: httpx.Client, meter: Meter, body: dict[str, Any], field: str
) -> None:
    assert fields(http.post("/v1/check", json=body)) == [field]
    event = {**body, "event_id": "e-1"}
    decided = http.post("/v1/events", params={"wait": "decision"}, json=event)
    assert fields(decided) == [field]
    first = {**CALLS, "event_id": "e-0"}
    batch = http.post("/v1/events", params={"wait": "decision"}, json=[first, event])
    assert fields(batch) == [f"events[1].{field}"]
    assert meter.count_results() == 0
