"""The API on the embedded default (SQLite, the SQLite broker) under uvicorn, over httpx."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.settings import Settings

Serve = Callable[[Any], str]  # the serve_api fixture
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def meter(embedded: dict[str, str]) -> Iterator[Meter]:
    with Meter(embedded["database_url"], clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=5, period="1h", window="calendar"))
        m.set_limit(Limit("org_calls", maximum=100, period="1d", window="calendar"))
        yield m


@pytest.fixture
def client(serve_api: Serve, meter: Meter, embedded: dict[str, str]) -> Iterator[httpx.Client]:
    settings = Settings(**embedded, api_max_events=10, api_max_body_bytes=20_000)
    base = serve_api(create_api(settings, meter=meter))
    with httpx.Client(base_url=base, timeout=30) as http:
        yield http


def event(event_id: str, cost: int = 1, **fields: Any) -> dict[str, Any]:
    return {"event_id": event_id, "subject": "org-1", "limit": "api_calls", "cost": cost, **fields}


def test_a_bad_event_names_its_field_and_nothing_is_stored(
    client: httpx.Client, meter: Meter
) -> None:
    answer = client.post("/v1/events", json=[event("a"), event("b", cost=0), event("c")])
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["type"] == "urn:metering:problem:invalid-input"
    assert problem["errors"] == [
        {"field": "events[1].cost", "message": "must be between 1 and 1000000000000, got 0"}
    ]
    assert meter.count_results() == 0
