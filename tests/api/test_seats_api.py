"""Seats over HTTP: a distinct limit through ``PUT /v1/limits/{name}``, read
back, refused when broken (nothing stored), and ``POST /v1/check`` telling a
held value from a new one (docs/seats.md). In process, on SQLite."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter

InProcess = Callable[[Any], httpx.Client]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
SEATS = {"maximum": 2, "period": "1mo", "window": "calendar", "distinct": "user"}


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        yield m


def test_a_seat_limit_is_set_read_and_checked(http: httpx.Client, meter: Meter) -> None:
    stored = http.put("/v1/limits/seats", json=SEATS)
    assert stored.status_code == 200, stored.text
    assert stored.json()["distinct"] == "user"
    assert http.get("/v1/limits/seats").json()["distinct"] == "user"
    assert meter.get_limit("seats") == Limit("seats", **SEATS)
    for user in ("ann", "bob"):
        meter.consume("org-1", "seats", metadata={"user": user})
    held = http.post(
        "/v1/check", json={"subject": "org-1", "limit": "seats", "metadata": {"user": "ann"}}
    )
    new = http.post(
        "/v1/check",
        json={"charges": [{"subject": "org-1", "limit": "seats"}], "metadata": {"user": "cy"}},
    )
    assert (held.status_code, held.json()["allowed"], held.json()["charges"][0]["cost"]) == (
        200,
        True,
        0,
    )
    assert (new.json()["allowed"], new.json()["denied_by"]) == (False, ["seats"])


def test_a_check_of_a_seat_limit_without_the_key_is_a_problem(
    http: httpx.Client, meter: Meter
) -> None:
    meter.set_limit(Limit("seats", **SEATS))
    answer = http.post("/v1/check", json={"subject": "org-1", "limit": "seats"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["errors"][0]["field"] == "metadata"
    assert "must carry it" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"algorithm": "token_bucket", "period": "10s", "window": "first_use"}, "distinct"),
        ({"distinct": "a b"}, "distinct"),
        ({"distinct": 7}, "distinct"),
    ],
)
def test_a_broken_seat_limit_is_400_and_stores_nothing(
    http: httpx.Client, meter: Meter, fields: dict[str, Any], field: str
) -> None:
    answer = http.put("/v1/limits/seats", json={**SEATS, **fields})
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["errors"][0]["field"]
    assert meter.list_limits() == [] or all(lim.name != "seats" for lim in meter.list_limits())


def test_the_openapi_document_describes_distinct(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    put = document["paths"]["/v1/limits/{name}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["distinct"]["examples"] == ["user"]
    assert "distinct" in document["components"]["schemas"]["LimitOut"]["properties"]
    single = document["components"]["schemas"]["SingleCheck"]
    assert "metadata" in single["properties"]
