"""``GET /v1/reports/usage?group_by=KEY`` and a limit's ``dimensions`` over HTTP,
on PostgreSQL and SQLite, under uvicorn (`serve_api`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import http_client

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.reports import usage_by_dimension_report
from metering.settings import Settings

Serve = Callable[[Any], str]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limits(
            [
                Limit("api", maximum=10, period="1h", dimensions=("route", "model")),
                Limit("plain", maximum=10, period="1h"),
            ]
        )
        for route, cost in (("/a", 3), ("/b", 1), ("/a", 2)):
            m.consume("org-1", "api", cost, metadata={"route": route})
        m.consume("org-1", "api", 1)
        yield m


@pytest.fixture
def http(serve_api: Serve, meter: Meter, tmp_path: Path) -> Iterator[httpx.Client]:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    with http_client(base_url=serve_api(create_api(settings, meter=meter)), timeout=30) as c:
        yield c


def test_usage_by_route_as_json_and_csv(http: httpx.Client, meter: Meter) -> None:
    params = {"subject": "org-1", "group_by": "route", "period": "2026-11"}
    answer = http.get("/v1/reports/usage", params=params)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert {k: body[k] for k in ("report", "subject", "group_by", "period")} == {
        "report": "usage_by",
        "subject": "org-1",
        "group_by": "route",
        "period": "2026-11",
    }
    assert body["since"] == "2026-11-01T00:00:00+00:00"
    assert [(r["limit"], r["value"], r["used"], r["events"]) for r in body["rows"]] == [
        ("api", "/a", 5, 2),
        ("api", None, 1, 1),  # ties by value: none ("") first
        ("api", "/b", 1, 1),
    ]
    expected = usage_by_dimension_report(meter, subject="org-1", key="route", period="2026-11")
    assert body["rows"] == [row.to_dict() for row in expected]

    as_csv = http.get("/v1/reports/usage", params=params, headers={"accept": "text/csv"})
    assert as_csv.status_code == 200
    assert as_csv.headers["content-disposition"] == 'attachment; filename="usage-by-route.csv"'
    assert list(csv.reader(io.StringIO(as_csv.text)))[1:] == [
        ["org-1", "api", "route", "/a", "5", "2"],
        ["org-1", "api", "route", "", "1", "1"],
        ["org-1", "api", "route", "/b", "1", "1"],
    ]


def test_limits_carry_their_dimensions(http: httpx.Client) -> None:
    assert http.get("/v1/limits/api").json()["dimensions"] == ["route", "model"]
    put = http.put("/v1/limits/zoned", json={"maximum": 5, "period": "1h", "dimensions": ["zone"]})
    assert put.status_code in (200, 201), put.text
    assert http.get("/v1/limits/zoned").json()["dimensions"] == ["zone"]
    bad = http.put("/v1/limits/zoned", json={"maximum": 5, "period": "1h", "dimensions": ["a b"]})
    assert bad.status_code in (400, 422) and bad.headers["content-type"] == PROBLEM
    assert http.get("/v1/limits/zoned").json()["dimensions"] == ["zone"]  # unchanged


BAD: list[tuple[dict[str, Any], int, str, str]] = [
    ({"subject": "org-1", "group_by": "zone", "limit": "api"}, 400, "invalid-input", "group_by"),
    ({"subject": "org-1", "group_by": "zone"}, 400, "invalid-input", "group_by"),
    ({"subject": "org-1", "group_by": ""}, 400, "invalid-input", "group_by"),
    ({"subject": "org-1", "group_by": "route", "limit": "nope"}, 422, "unknown-limit", "limit"),
    (
        {"subject": "org-1", "group_by": "route", "since": "2026-11-01T10:30"},
        400,
        "invalid-input",
        "since",
    ),
    ({"group_by": "route"}, 400, "invalid-input", "subject"),
]


def test_bad_group_by_is_a_problem_naming_the_field(http: httpx.Client) -> None:
    for params, status, slug, field in BAD:
        for accept in ("application/json", "text/csv"):
            answer = http.get("/v1/reports/usage", params=params, headers={"accept": accept})
            case = f"{params} {accept}: {answer.text}"
            assert answer.status_code == status, case
            assert answer.headers["content-type"] == PROBLEM, case
            body = answer.json()
            assert body["type"] == f"urn:metering:problem:{slug}", case
            assert [e["field"] for e in body["errors"]] == [field], case
    detail = http.get(
        "/v1/reports/usage", params={"subject": "org-1", "group_by": "zone", "limit": "api"}
    ).json()["detail"]
    assert "limit api does not record dimension 'zone'; it records route, model" in detail
