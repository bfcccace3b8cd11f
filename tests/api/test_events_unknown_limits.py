"""``POST /v1/events`` refuses a charge to an undefined limit at ingest, in
every body form: a 422 ``unknown-limit`` problem naming it, nothing queued.
The limits come from the API's cache, reloaded once on a miss, so a limit
another process defined a moment ago is accepted."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api.parsing import MAX_ERRORS
from metering.storage.queue_state import read_envelope

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
CLOUDEVENT = "application/cloudevents+json"
CLOUDEVENTS = "application/cloudevents-batch+json"


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=10, period="1h", window="calendar"))
        yield m


def queued_ids(tmp_path: Path) -> list[str]:
    """Every event id in the test's embedded broker (the `http` fixture's)."""
    try:
        with sqlite3.connect(tmp_path / "broker.db") as connection:
            rows = connection.execute("SELECT payload FROM kombu_message").fetchall()
    except sqlite3.OperationalError:  # kombu makes its table on the first message
        return []
    messages = [read_envelope(payload, "metering", unacked=False) for (payload,) in rows]
    return [event_id for message in messages if message for event_id in message.event_ids]


def plain(event_id: str, limit: str = "api_calls") -> dict[str, Any]:
    return {"event_id": event_id, "subject": "org-1", "limit": limit}


def cloudevent(event_id: str, limit: str) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": "https://billing.example.com",
        "type": "com.example.usage",
        "subject": "org-1",
        "data": {"limit": limit},
    }


def refused(answer: httpx.Response) -> list[dict[str, str]]:
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["type"] == "urn:metering:problem:unknown-limit"
    assert "api_cals" in body["detail"]
    errors: list[dict[str, str]] = body["errors"]
    return errors


def test_a_single_event_for_an_unknown_limit_is_422_and_not_queued(
    http: httpx.Client, tmp_path: Path
) -> None:
    errors = refused(http.post("/v1/events", json=plain("e-1", "api_cals")))
    assert errors == [{"field": "limit", "message": "unknown limit 'api_cals'"}]
    assert queued_ids(tmp_path) == []


def test_one_unknown_limit_in_a_batch_refuses_the_whole_batch(
    http: httpx.Client, tmp_path: Path
) -> None:
    stacked = {
        "event_id": "e-3",
        "charges": [
            {"subject": "org-1", "limit": "api_calls"},
            {"subject": "o", "limit": "api_cals"},
        ],
    }
    answer = http.post("/v1/events", json=[plain("e-1"), plain("e-2", "api_cals"), stacked])
    assert [e["field"] for e in refused(answer)] == [
        "events[1].limit",
        "events[2].charges[1].limit",
    ]
    assert queued_ids(tmp_path) == []


def test_cloudevents_for_an_unknown_limit_are_refused(http: httpx.Client, tmp_path: Path) -> None:
    one = json.dumps(cloudevent("c-1", "api_cals"))
    answer = http.post("/v1/events", content=one, headers={"content-type": CLOUDEVENT})
    assert [e["field"] for e in refused(answer)] == ["data.limit"]
    both = json.dumps([cloudevent("c-2", "api_calls"), cloudevent("c-3", "api_cals")])
    answer = http.post("/v1/events", content=both, headers={"content-type": CLOUDEVENTS})
    assert [e["field"] for e in refused(answer)] == ["events[1].data.limit"]
    assert queued_ids(tmp_path) == []


def test_a_limit_defined_by_another_process_a_moment_ago_is_accepted(
    http: httpx.Client, meter: Meter, tmp_path: Path
) -> None:
    assert http.post("/v1/events", json=plain("e-1")).status_code == 202  # the cache is loaded
    with Meter(meter.url) as other:  # another process: a cache of its own
        other.set_limit(Limit("api_cals", maximum=10, period="1h", window="calendar"))
    answer = http.post("/v1/events", json=plain("e-2", "api_cals"))
    assert answer.status_code == 202, answer.text
    assert sorted(queued_ids(tmp_path)) == ["e-1", "e-2"]


def test_a_body_of_many_unknown_limits_gets_a_bounded_answer(
    http: httpx.Client, tmp_path: Path
) -> None:
    stacked = [
        {
            "event_id": f"e-{n}",
            "charges": [{"subject": "o", "limit": f"u{n}-{k}"} for k in range(4)],
        }
        for n in range(300)
    ]
    answer = http.post("/v1/events", json=[plain("e-api_cals", "api_cals"), *stacked])
    errors = refused(answer)
    assert len(errors) == MAX_ERRORS  # as many as any invalid body names, not 1,201
    assert errors[0] == {"field": "events[0].limit", "message": "unknown limit 'api_cals'"}
    assert "'u0-3'" in answer.json()["detail"]
    assert "'u2-1'" not in answer.json()["detail"]  # the first ten named
    assert "and 1,191 more" in answer.json()["detail"]
    assert queued_ids(tmp_path) == []
