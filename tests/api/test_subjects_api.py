"""Subjects' time zones over HTTP: ``PUT``, ``GET /v1/subjects/{subject}`` and ``GET
/v1/subjects``, described in the OpenAPI document; a decision's window of a zoned
subject at its local midnight; an unknown zone a 400 naming ``time_zone``, nothing
stored (docs/time-zones.md). In process, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter

JANUARY = datetime(2026, 1, 15, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(JANUARY)) as m:
        m.set_limit(Limit("daily", maximum=5, period="1d", window="calendar"))
        yield m


def test_a_zone_is_set_read_and_listed(http: httpx.Client, meter: Meter) -> None:
    put = http.put("/v1/subjects/org/42", json={"time_zone": "Asia/Kathmandu"})
    assert put.status_code == 200, put.text
    assert put.json() == {
        "subject": "org/42",
        "time_zone": "Asia/Kathmandu",
        "since": "2026-01-15T00:00:00+00:00",
    }
    assert http.get("/v1/subjects/org/42").json() == put.json()
    assert http.get("/v1/subjects/org-7").json() == {
        "subject": "org-7",
        "time_zone": "UTC",
        "since": None,
    }
    assert http.get("/v1/subjects").json() == {"subjects": [put.json()]}
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    clock.set(datetime(2026, 4, 5, 20, tzinfo=UTC))
    answer = http.post(
        "/v1/events",
        params={"wait": "decision"},
        json={"subject": "org/42", "limit": "daily", "cost": 1},
    ).json()["results"][0]
    charge = answer["charges"][0]
    assert charge["window_start"] == "2026-04-05T18:15:00+00:00"  # Kathmandu's midnight
    assert charge["resets_at"] == "2026-04-06T18:15:00+00:00"


def test_usage_carries_the_local_label(http: httpx.Client, meter: Meter) -> None:
    meter.set_limit(Limit("monthly", maximum=50, period="1mo", window="calendar"))
    meter.set_time_zone("org-kolkata", "Asia/Kolkata")
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    clock.set(datetime(2026, 3, 10, tzinfo=UTC))  # the zone in force from February's end
    for subject in ("org-kolkata", "org-utc"):
        meter.consume(subject, "monthly", 2)
    zoned = http.get("/v1/subjects/org-kolkata/usage").json()["limits"]
    assert [(u["limit"], u["time_zone"], u["local_window"]) for u in zoned] == [
        ("monthly", "Asia/Kolkata", "2026-03 Asia/Kolkata")
    ]
    assert zoned[0]["window_start"] == "2026-02-28T18:30:00+00:00"  # Kolkata's midnight
    [plain] = http.get("/v1/subjects/org-utc/usage").json()["limits"]
    assert (plain["time_zone"], plain["local_window"]) == (None, None)
    [usage] = meter.usage("org-kolkata")
    assert (usage.time_zone, usage.local_window) == ("Asia/Kolkata", "2026-03 Asia/Kolkata")
    schema = http.get("/openapi.json").json()["components"]["schemas"]["LimitUsageOut"]
    assert {"time_zone", "local_window"} <= set(schema["properties"])


@pytest.mark.parametrize(
    "body",
    [{"time_zone": "Mars/Olympus"}, {"time_zone": 5}, {}, {"time_zone": "UTC", "other": 1}],
)
def test_a_bad_zone_is_400_and_stores_nothing(
    http: httpx.Client, meter: Meter, body: dict[str, Any]
) -> None:
    answer = http.put("/v1/subjects/org-42", json=body)
    assert answer.status_code == 400, answer.text
    assert meter.subject_zones() == []


def test_the_openapi_document_describes_subjects(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    put = document["paths"]["/v1/subjects/{subject}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert "IANA time zone" in body["properties"]["time_zone"]["description"]
    assert "admin" in str(put["security"])
    assert "get" in document["paths"]["/v1/subjects"]
    schemas = document["components"]["schemas"]
    assert {"subject", "time_zone", "since"} <= set(schemas["SubjectOut"]["properties"])
