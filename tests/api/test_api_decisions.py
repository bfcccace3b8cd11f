"""``POST /v1/check`` and ``GET /v1/subjects/{subject}/usage``
(`metering/api/decisions.py`), called in process: a check answers what
`consume` would and records nothing; usage is each limit the subject used,
with the subject's own maximum; bad input is a problem naming its field."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=5, period="1h", window="calendar"))
        m.set_limit(Limit("org_calls", maximum=100, period="1d", window="calendar"))
        yield m


@pytest.fixture
def client(http: httpx.Client) -> httpx.Client:
    return http


def event(event_id: str, cost: int = 1, **fields: Any) -> dict[str, Any]:
    return {"event_id": event_id, "subject": "org-1", "limit": "api_calls", "cost": cost, **fields}


def test_check_and_usage(client: httpx.Client) -> None:
    client.post("/v1/events", params={"wait": "decision"}, json=event("e-1", 5))
    check = client.post("/v1/check", json={"subject": "org-1", "limit": "api_calls"})
    assert check.status_code == 200
    assert check.json()["allowed"] is False
    assert check.json()["retry_at"] == "2026-11-22T10:00:00+00:00"
    usage = client.get("/v1/subjects/org-1/usage").json()
    assert usage == {
        "subject": "org-1",
        "limits": [
            {
                "limit": "api_calls",
                "algorithm": "fixed_window",
                "enforcement": "hard",
                "maximum": 5,
                "used": 5,
                "remaining": 0,
                "overage": 0,
                "window_start": "2026-11-22T09:00:00+00:00",
                "resets_at": "2026-11-22T10:00:00+00:00",
                "retry_at": "2026-11-22T10:00:00+00:00",
                "grants_left": 0,
                "exhausts_at": "2026-11-22T09:30:00+00:00",  # spent: now
                "time_zone": None,  # a subject without a time zone
                "local_window": None,
            }
        ],
    }
    assert client.get("/v1/subjects/nobody/usage").json() == {"subject": "nobody", "limits": []}


def test_usage_shows_the_subjects_own_maximum(client: httpx.Client, meter: Meter) -> None:
    """An entitlement is the maximum the subject's charges meet: usage gives it,
    with what is left of it, not the limit's default."""
    meter.set_entitlement("org-1", "api_calls", 20, effective_from=NOW)
    client.post("/v1/events", params={"wait": "decision"}, json=event("e-1", 8))
    check = client.post("/v1/check", json={"subject": "org-1", "limit": "api_calls"}).json()
    assert check["allowed"] is True
    [usage] = client.get("/v1/subjects/org-1/usage").json()["limits"]
    assert (usage["maximum"], usage["used"], usage["remaining"]) == (20, 8, 12)
    assert (usage["overage"], usage["retry_at"]) == (0, None)


def test_a_check_records_nothing_and_takes_stacked_charges(
    client: httpx.Client, meter: Meter
) -> None:
    stacked = {
        "charges": [
            {"subject": "org-1", "limit": "api_calls", "cost": 2},
            {"subject": "org-1", "limit": "org_calls", "cost": 2},
        ]
    }
    answer = client.post("/v1/check", json=stacked)
    assert answer.status_code == 200
    assert answer.json()["allowed"] is True
    assert meter.count_results() == 0
    assert meter.counters("org-1") == []


def test_a_bad_check_is_a_problem_naming_its_field(client: httpx.Client) -> None:
    cost = client.post("/v1/check", json={"subject": "org-1", "limit": "api_calls", "cost": 0})
    assert cost.status_code == 400
    assert cost.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in cost.json()["errors"]] == ["cost"]  # as /v1/events names it
    unknown = client.post("/v1/check", json={"subject": "org-1", "limit": "nope"})
    assert unknown.status_code == 422
    assert unknown.json()["type"] == "urn:metering:problem:unknown-limit"
    not_json = client.post("/v1/check", content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400
