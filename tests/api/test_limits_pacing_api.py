"""Pacing over HTTP: ``pacing`` and ``burst`` through ``PUT /v1/limits/{name}``,
read back and described in the OpenAPI document; a denial ahead of the pace
answers its ``retry_at``; a bad burst is a 400 naming it, and stores nothing
(docs/pacing.md). In process, on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter

NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
BUDGET = {"maximum": 3000, "period": "1mo", "window": "calendar", "pacing": True}


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOVEMBER)) as m:
        yield m


def test_a_paced_limit_is_set_read_and_decided(http: httpx.Client, meter: Meter) -> None:
    stored = http.put("/v1/limits/budget", json={**BUDGET, "burst": "10%"})
    assert stored.status_code == 200, stored.text
    assert (stored.json()["pacing"], stored.json()["burst"]) == (True, "10%")
    assert meter.get_limit("budget") == Limit("budget", **{**BUDGET, "burst": "10%"})
    http.put("/v1/limits/calls", json={"maximum": 5, "period": "1h"})
    assert "pacing" not in http.get("/v1/limits/calls").json()
    answers = [
        http.post(
            "/v1/events",
            params={"wait": "decision"},
            json={"subject": "org-1", "limit": "budget", "cost": cost},
        ).json()["results"][0]
        for cost in (300, 1)
    ]
    assert [a["outcome"] for a in answers] == ["allowed", "denied"]
    retry_at = datetime.fromisoformat(answers[1]["charges"][0]["retry_at"])
    assert retry_at == datetime(2026, 11, 1, 0, 14, 24, tzinfo=UTC)  # 864 s a unit


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"burst": "150%"}, "burst"),
        ({"burst": -1}, "burst"),
        ({"pacing": False, "burst": 3}, "burst"),
        ({"algorithm": "token_bucket", "period": "10s", "window": "first_use"}, "pacing"),
        ({"pacing": "sometimes"}, "pacing"),
    ],
)
def test_a_bad_pace_is_400_and_stores_nothing(
    http: httpx.Client, meter: Meter, fields: dict[str, Any], field: str
) -> None:
    answer = http.put("/v1/limits/budget", json={**BUDGET, **fields})
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["errors"][0]["field"]
    assert all(limit.name != "budget" for limit in meter.list_limits())


def test_the_openapi_document_describes_pacing(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    put = document["paths"]["/v1/limits/{name}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert "share of the maximum" in body["properties"]["pacing"]["description"]
    assert "burst" in body["properties"]
    schemas = document["components"]["schemas"]
    assert {"pacing", "burst"} <= set(schemas["LimitOut"]["properties"])
    outcomes = schemas["ChargeDecisionOut"]["properties"]["outcome"]["enum"]
    assert {"would_deny", "ahead_of_pace"} <= set(outcomes)
