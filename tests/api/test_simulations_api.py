"""``POST /v1/simulations``: the backtest over HTTP, for an admin key only
(in process, SQLite and PostgreSQL), with bad bodies answered by 400 problems."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.apikeys import ApiKeys

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROPOSED = {"calls": {"maximum": 2, "period": "1h", "window": "calendar"}}


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    clock = FrozenClock(NOW - timedelta(minutes=20))
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("calls", maximum=3, period="1h", window="calendar"))
        for index in range(5):
            clock.advance(minutes=1)
            m.consume("org-1" if index < 4 else "org-2", "calls", event_id=f"e{index}")
        clock.set(NOW)
        yield m


@pytest.fixture
def http(http: httpx.Client, meter: Meter) -> httpx.Client:
    """The conftest's client, with an admin key."""
    client = http
    keys = ApiKeys(meter)
    client.headers["authorization"] = f"Bearer {keys.create('admin', 'admin')[1]}"
    client.headers["x-read-token"] = keys.create("read", "read")[1]
    return client


def test_a_backtest_answers_the_figures(http: httpx.Client, meter: Meter) -> None:
    before = meter.counters(limit="calls")  # (each request charges the key's rate)
    answer = http.post("/v1/simulations", json={"limits": PROPOSED, "since": "1d"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["events"], body["until"]) == (5, NOW.isoformat())
    assert body["rows"] == [
        {
            "subject": "org-1",
            "limit": "calls",
            "events": 4,
            "would_deny_events": 2,
            "would_deny_cost": 2,
            "overage": 0,
            "denied_events_then": 1,
        },
        {
            "subject": "org-2",
            "limit": "calls",
            "events": 1,
            "would_deny_events": 0,
            "would_deny_cost": 0,
            "overage": 0,
            "denied_events_then": 0,
        },
    ]
    entitled = {
        "limits": [{"name": "calls", "maximum": 2, "period": "1h", "window": "calendar"}],
        "entitlements": [{"subject": "org-1", "limit": "calls", "maximum": 4}],
        "since": (NOW - timedelta(hours=1)).isoformat(),
        "subject": "org-1",
    }
    [row] = http.post("/v1/simulations", json=entitled).json()["rows"]
    assert (row["subject"], row["would_deny_events"]) == ("org-1", 0)
    assert meter.counters(limit="calls") == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"since": "1d"}, "limits"),
        ({"limits": PROPOSED}, "since"),
        ({"limits": PROPOSED, "since": "tomorrow"}, "since"),
        ({"limits": PROPOSED, "since": "2099-01-01T00:00:00Z"}, "since"),
        ({"limits": PROPOSED, "since": "500d"}, "since"),  # older than the results kept
        ({"limits": {"calls": {"maximum": 0, "period": "1h"}}, "since": "1d"}, "limits file"),
        ({"limits": {"calls": 3}, "since": "1d"}, "limits"),
        (
            {"limits": PROPOSED, "since": "1d", "entitlements": [{"subject": "s"}]},
            "entitlements file",
        ),
        ({"limits": PROPOSED, "since": "1d", "other": 1}, "other"),
    ],
)
def test_bad_bodies_are_400_problems(http: httpx.Client, body: Any, field: str) -> None:
    answer = http.post("/v1/simulations", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in answer.json()["errors"]] == [field]


def test_only_an_admin_key_may_simulate(http: httpx.Client) -> None:
    read = {"authorization": f"Bearer {http.headers['x-read-token']}"}
    answer = http.post("/v1/simulations", json={"limits": PROPOSED, "since": "1d"}, headers=read)
    assert answer.status_code == 403
    schema = http.get("/openapi.json").json()
    operation = schema["paths"]["/v1/simulations"]["post"]
    assert "200" in operation["responses"] and "requestBody" in operation
