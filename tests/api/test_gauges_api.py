"""Gauges over HTTP: ``aggregation`` through ``PUT /v1/limits/{name}``, read
back and described in the OpenAPI document; a broken gauge refused (nothing
stored); a level of 0 accepted for a gauge and refused for a sum, queued
or decided at once, naming the charge (docs/gauges.md). In process, on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
GAUGE = {"maximum": 100, "period": "1mo", "window": "calendar", "aggregation": "max"}


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(sqlite_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=clock) as m:
        yield m


def test_a_gauge_is_set_read_and_decided(http: httpx.Client, meter: Meter) -> None:
    stored = http.put("/v1/limits/storage", json=GAUGE)
    assert stored.status_code == 200, stored.text
    assert stored.json()["aggregation"] == "max"
    assert http.get("/v1/limits/storage").json()["aggregation"] == "max"
    assert meter.get_limit("storage") == Limit("storage", **GAUGE)
    http.put("/v1/limits/calls", json={"maximum": 5, "period": "1h"})
    assert http.get("/v1/limits/calls").json()["aggregation"] == "sum"
    for level in (70, 20, 0):
        answer = http.post(
            "/v1/events",
            params={"wait": "decision"},
            json={"subject": "org-1", "limit": "storage", "cost": level},
        )
        assert answer.status_code == 200, answer.text
    assert answer.json()["results"][0]["charges"][0]["used"] == 70


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"algorithm": "token_bucket", "period": "10s", "window": "first_use"}, "aggregation"),
        ({"distinct": "user"}, "aggregation"),
        ({"aggregation": "avg"}, "aggregation"),
    ],
)
def test_a_broken_gauge_is_400_and_stores_nothing(
    http: httpx.Client, meter: Meter, fields: dict[str, Any], field: str
) -> None:
    answer = http.put("/v1/limits/storage", json={**GAUGE, **fields})
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["errors"][0]["field"]
    assert all(lim.name != "storage" for lim in meter.list_limits())


@pytest.mark.parametrize("wait", [False, True], ids=["queued", "wait"])
def test_a_level_of_0_is_a_gauge_s_only(http: httpx.Client, meter: Meter, wait: bool) -> None:
    meter.set_limits([Limit("storage", **GAUGE), Limit("calls", maximum=5, period="1h")])  # type: ignore[arg-type]
    params = {"wait": "decision"} if wait else {}
    fine = http.post(
        "/v1/events", params=params, json={"subject": "org-1", "limit": "storage", "cost": 0}
    )
    assert fine.status_code == (200 if wait else 202), fine.text
    body = {
        "charges": [
            {"subject": "org-1", "limit": "storage", "cost": 0},
            {"subject": "org-1", "limit": "calls", "cost": 0},
        ]
    }
    refused = http.post("/v1/events", params=params, json=body)
    assert refused.status_code == 400, refused.text
    assert [e["field"] for e in refused.json()["errors"]] == ["charges[1].cost"]
    assert "between 1 and" in refused.json()["detail"]


def test_the_openapi_document_describes_aggregation(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    put = document["paths"]["/v1/limits/{name}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert "gauge" in body["properties"]["aggregation"]["description"]
    assert "aggregation" in document["components"]["schemas"]["LimitOut"]["properties"]
    cost = document["components"]["schemas"]["SingleEvent"]["properties"]["cost"]
    assert cost["minimum"] == 0 and "gauge" in cost["description"]


def test_a_void_after_a_limit_became_a_gauge_takes_off_its_cost_alone(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    """Five events of 3 summed (15) in November; the limit is made a gauge
    only once that window is over (before, a 400: its counter would be read
    as a peak). Voiding one then takes 3 off (12), not the window down to the
    peak of its events (3)."""
    summed = {**GAUGE, "aggregation": "sum"}
    assert http.put("/v1/limits/storage", json=summed).status_code == 200
    for n in range(5):
        event = {"event_id": f"job-{n}", "subject": "org-1", "limit": "storage", "cost": 3}
        assert http.post("/v1/events", params={"wait": "decision"}, json=event).status_code == 200
    refused = http.put("/v1/limits/storage", json=GAUGE)
    assert refused.status_code == 400
    assert "counted in units in a window not yet over" in refused.text
    clock.advance(days=9)  # December
    assert http.put("/v1/limits/storage", json=GAUGE).status_code == 200
    voided = http.post("/v1/events/job-0/void", json={"reason": "refund"})
    assert voided.status_code == 201, voided.text
    [november] = meter.counters("org-1", "storage")
    assert november.used == 12
