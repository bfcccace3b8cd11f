"""The CloudEvents Python SDK as a real client: structured and batch mode.

The SDK builds and serialises each event (`to_structured` gives the headers
and body of structured mode; a batch is a JSON array of `to_json` bodies,
``application/cloudevents-batch+json``), httpx sends it to uvicorn, and the
decisions show the mapping: ``(source, id)`` is the event's identity (its
event id is ``id@`` and a digest of the source), ``subject`` the
subject, ``time`` occurred_at, ``data`` the charge(s) and the other data
keys the metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cloudevents.v1.conversion import to_json, to_structured
from cloudevents.v1.http import CloudEvent
from loopback import http_client

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.domain.events import cloudevent_event_id
from metering.settings import Settings

Serve = Callable[[Any], str]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
BATCH = "application/cloudevents-batch+json"
SOURCE = "https://billing.example.com/svc"


def eid(cloudevent_id: str, source: str = SOURCE) -> str:
    return cloudevent_event_id(source, cloudevent_id)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=10, period="1h", window="calendar"))
        m.set_limit(Limit("org_calls", maximum=100, period="1d", window="calendar"))
        yield m


@pytest.fixture
def client(serve_api: Serve, meter: Meter, tmp_path: Path) -> Iterator[httpx.Client]:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    with http_client(base_url=serve_api(create_api(settings, meter=meter)), timeout=30) as http:
        yield http


def usage(
    event_id: str, data: dict[str, Any], subject: str | None = "org-1", source: str = SOURCE
) -> CloudEvent:
    attributes = {
        "id": event_id,
        "source": source,
        "type": "com.example.usage",
        "time": (NOW - timedelta(minutes=1)).isoformat(),
    }
    if subject is not None:
        attributes["subject"] = subject
    return CloudEvent(attributes, data)


def batch(events: list[CloudEvent]) -> tuple[dict[str, str], bytes]:
    return {"content-type": BATCH}, b"[" + b",".join(to_json(e) for e in events) + b"]"


def test_structured_mode_maps_id_subject_time_and_data(client: httpx.Client) -> None:
    event = usage("ce-1", {"limit": "api_calls", "cost": 3, "route": "/export", "region": "eu"})
    headers, body = to_structured(event)
    assert headers["content-type"] == "application/cloudevents+json"
    answer = client.post("/v1/events", headers=headers, content=body, params={"wait": "decision"})
    assert answer.status_code == 200, answer.text
    [result] = answer.json()["results"]
    assert result["event_id"] == eid("ce-1")
    assert result["occurred_at"] == "2026-11-22T09:29:00+00:00"
    assert result["metadata"] == {"route": "/export", "region": "eu"}
    [charge] = result["charges"]
    assert (charge["subject"], charge["limit"], charge["cost"], charge["used"]) == (
        "org-1",
        "api_calls",
        3,
        3,
    )


def test_structured_mode_queued_is_202_with_the_id(client: httpx.Client) -> None:
    headers, body = to_structured(usage("ce-2", {"limit": "api_calls"}))
    answer = client.post("/v1/events", headers=headers, content=body)
    assert answer.status_code == 202
    assert answer.json() == {"accepted": [eid("ce-2")], "duplicates": []}


def test_batch_mode_with_stacked_charges(client: httpx.Client, meter: Meter) -> None:
    events = [
        usage("b-1", {"limit": "api_calls", "cost": 2}),
        # data.charges: a charge without a subject takes the event's.
        usage(
            "b-2",
            {"charges": [{"limit": "api_calls"}, {"subject": "org-9", "limit": "org_calls"}]},
            subject="org-1",
        ),
        usage("b-3", {"charges": [{"subject": "org-9", "limit": "org_calls", "cost": 5}]}, None),
    ]
    headers, body = batch(events)
    answer = client.post("/v1/events", headers=headers, content=body, params={"wait": "decision"})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["event_id"] for r in results] == [eid("b-1"), eid("b-2"), eid("b-3")]
    assert [[(c["subject"], c["limit"]) for c in r["charges"]] for r in results] == [
        [("org-1", "api_calls")],
        [("org-1", "api_calls"), ("org-9", "org_calls")],
        [("org-9", "org_calls")],
    ]
    assert sum(c.used for c in meter.counters("org-1", "api_calls")) == 3
    assert sum(c.used for c in meter.counters("org-9", "org_calls")) == 6
    # The same batch again: every id answered from the ledger.
    again = client.post("/v1/events", headers=headers, content=body)
    assert again.status_code == 202
    assert again.json()["accepted"] == []
    assert [r["event_id"] for r in again.json()["duplicates"]] == [
        eid("b-1"),
        eid("b-2"),
        eid("b-3"),
    ]
    assert all(r["duplicate"] for r in again.json()["duplicates"])


def test_batch_mode_queued(client: httpx.Client) -> None:
    headers, body = batch([usage(f"q-{i}", {"limit": "api_calls"}) for i in range(3)])
    answer = client.post("/v1/events", headers=headers, content=body)
    assert answer.status_code == 202
    assert answer.json()["accepted"] == [eid("q-0"), eid("q-1"), eid("q-2")]


def test_the_same_id_from_two_sources_is_two_events(client: httpx.Client, meter: Meter) -> None:
    """A CloudEvent's identity is (source, id): both are billed; a resend is not."""
    first = usage("evt-1", {"limit": "api_calls", "cost": 2}, source="/producer/a")
    second = usage("evt-1", {"limit": "api_calls", "cost": 2}, source="/producer/b")
    for event in (first, second, first):
        headers, body = to_structured(event)
        answer = client.post(
            "/v1/events", headers=headers, content=body, params={"wait": "decision"}
        )
        assert answer.status_code == 200, answer.text
    assert sum(c.used for c in meter.counters("org-1", "api_calls")) == 4
    ids = {eid("evt-1", "/producer/a"), eid("evt-1", "/producer/b")}
    assert len(ids) == 2 and meter.decided(ids) == ids
    assert all(i.startswith("evt-1@") for i in ids)


def test_an_sdk_event_with_binary_data_is_refused(client: httpx.Client, meter: Meter) -> None:
    headers, body = to_structured(usage("bin-1", b"\x00\x01"))  # type: ignore[arg-type]
    answer = client.post("/v1/events", headers=headers, content=body)
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "data_base64"
    assert meter.count_results() == 0
