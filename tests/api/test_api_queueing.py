"""Getting events to the workers or deciding them at once
(`metering/api/queueing.py`), called in process: ``?wait=decision`` answers
like `consume` (a repeated id its stored result, other charges a 409); queued
events are pending until a worker decides them; a broker that does not answer
is a 503 naming the events the producer keeps. Ids repeated within a request
and unknown limits are refused before anything is queued or applied."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.api.parsing import Parsed
from metering.api.problems import ApiProblem
from metering.api.queueing import ApiProducer, apply_now, unique_events, unknown_limits
from metering.domain.events import make_event
from metering.settings import Settings

InProcess = Callable[[Any], httpx.Client]  # the in_process fixture (tests/api/conftest.py)

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


def parsed(event_id: str, cost: int = 1, limit: str = "api_calls", index: int = 0) -> Parsed:
    made = make_event([("org-1", limit, cost)], NOW, event_id)
    return Parsed(made, f"[{index}]", "single")


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
    in_process: InProcess, meter: Meter
) -> None:
    nowhere = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    producer = ApiProducer(nowhere, retry_attempts=1, flush_interval_seconds=3600)
    try:
        app = create_api(Settings(meter.url, nowhere), meter=meter, producer=producer)
        answer = in_process(app).post("/v1/events", json=[event("k-1"), event("k-2")])
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


def test_the_apis_own_producer_retries_after_the_settings_backoff(
    in_process: InProcess, meter: Meter, tmp_path: Path
) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    app = create_api(Settings(meter.url, broker, api_retry_backoff_seconds=0.05), meter=meter)
    in_process(app)  # the lifespan makes the producer
    assert app.state.metering.producer.retry_backoff_seconds == 0.05


def test_an_id_repeated_in_a_request_with_other_charges_is_a_conflict() -> None:
    same = unique_events([parsed("a"), parsed("b"), parsed("a"), parsed("b")])
    assert [e.event_id for e in same] == ["a", "b"]  # the first of each id
    with pytest.raises(ApiProblem) as raised:
        unique_events([parsed("a"), parsed("a", 2), parsed("a", 3)])
    assert (raised.value.status, raised.value.extra) == (409, {"event_ids": ["a"]})
    assert "in this request" in raised.value.detail


def test_unknown_limits_name_each_charge_to_them() -> None:
    items = [parsed("a", limit="nope"), parsed("b"), parsed("c", limit="nope", index=2)]
    problem = unknown_limits(items, ["nope"])
    assert (problem.status, problem.slug) == (422, "unknown-limit")
    assert [pointer for pointer, _ in problem.errors] == ["[0].limit", "[2].limit"]
    assert problem.detail.endswith("nothing was queued")
    many = unknown_limits([], [f"l{n}" for n in range(12)], verb="applied")
    assert "and 2 more" in many.detail and many.detail.endswith("nothing was applied")
    assert many.errors[0][0] == "limit"


def test_a_key_that_may_only_ingest_records_no_denial(meter: Meter) -> None:
    """Without ``record_denials`` an event denied when checked is answered so
    and never applied; one that fits is applied as any other."""
    meter.consume("org-1", "api_calls", 3)
    fits, denied = parsed("fits", 2), parsed("denied", 3, index=1)
    answers = asyncio.run(apply_now(meter, [fits, denied], record_denials=False))
    assert [(d.event_id, d.allowed) for d in answers] == [("fits", True), ("denied", False)]
    assert meter.decided(["fits", "denied"]) == {"fits"}
    recorded = asyncio.run(apply_now(meter, [parsed("recorded", 4)]))
    assert not recorded[0].allowed and meter.decided(["recorded"]) == {"recorded"}
