"""The API on the embedded default (SQLite, the SQLite broker) under uvicorn, over httpx."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.api.queueing import ApiProducer
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


def test_wait_decision_answers_like_consume(client: httpx.Client, meter: Meter) -> None:
    first = client.post("/v1/events", params={"wait": "decision"}, json=event("e-1", 2))
    assert first.status_code == 200
    [result] = first.json()["results"]
    assert (result["status"], result["outcome"], result["used"], result["remaining"]) == (
        "decided",
        "allowed",
        2,
        3,
    )
    assert result["duplicate"] is False
    again = client.post("/v1/events", params={"wait": "decision"}, json=event("e-1", 2))
    assert again.json()["results"][0]["duplicate"] is True
    other = client.post("/v1/events", params={"wait": "decision"}, json=event("e-1", 3))
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"
    assert other.json()["event_ids"] == ["e-1"]
    assert [c.used for c in meter.counters("org-1", "api_calls")] == [2]
    fetched = client.get("/v1/events/e-1").json()
    assert fetched["outcome"] == "allowed" and fetched["duplicate"] is False


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
            }
        ],
    }
    assert client.get("/v1/subjects/nobody/usage").json() == {"subject": "nobody", "limits": []}


def test_queued_events_are_pending_and_an_unknown_id_is_404(client: httpx.Client) -> None:
    answer = client.post("/v1/events", json=[event("q-1"), event("q-2")])
    assert answer.status_code == 202
    assert answer.json() == {"accepted": ["q-1", "q-2"], "duplicates": []}
    # No worker runs: both wait on the embedded broker.
    pending = client.get("/v1/events/q-2")
    assert pending.status_code == 200
    assert pending.json() == {"status": "pending", "event_id": "q-2"}
    missing = client.get("/v1/events/never-sent")
    assert missing.status_code == 404
    assert missing.json()["type"] == "urn:metering:problem:not-found"


def test_a_broker_that_does_not_answer_is_503_naming_the_kept_events(
    serve_api: Serve, meter: Meter, embedded: dict[str, str]
) -> None:
    nowhere = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    producer = ApiProducer(nowhere, retry_attempts=1, flush_interval_seconds=3600)
    try:
        base = serve_api(create_api(Settings(meter.url, nowhere), meter=meter, producer=producer))
        with httpx.Client(base_url=base, timeout=60) as http:
            answer = http.post("/v1/events", json=[event("k-1"), event("k-2")])
        assert answer.status_code == 503
        assert answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert problem["type"] == "urn:metering:problem:broker-unavailable"
        assert problem["event_ids"] == ["k-1", "k-2"]
        assert problem["kept"] == ["k-1", "k-2"]  # held, and sent once the broker is back
        assert producer.kept == ["k-1", "k-2"]
    finally:
        producer.discard()
        producer.close()


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
