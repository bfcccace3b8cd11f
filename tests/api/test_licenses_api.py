"""Floating licenses over HTTP (in process): POST, GET and DELETE /v1/checkouts,
renew, the problems of bad input, and the routes in the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.settings import Settings

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"
InProcess = Callable[[Any], httpx.Client]  # the in_process fixture


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("cad", maximum=1, algorithm="concurrent"))
        m.set_limit(Limit("calls", maximum=5, period="1h"))
        yield m


@pytest.fixture
def http(in_process: InProcess, meter: Meter, tmp_path: Path) -> httpx.Client:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    return in_process(create_api(settings, meter=meter))


def problem(answer: httpx.Response, status: int, slug: str) -> Any:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    body = answer.json()
    assert body["type"] == f"urn:metering:problem:{slug}"
    return body


def test_checkout_renew_checkin(http: httpx.Client, clock: FrozenClock) -> None:
    taken = http.post("/v1/checkouts", json={"subject": "org-1", "limit": "cad", "ttl_seconds": 60})
    assert taken.status_code == 200, taken.text
    body = taken.json()
    assert (body["state"], body["allowed"], body["held"], body["maximum"]) == ("held", True, 1, 1)
    assert body["expires_at"] == "2026-11-22T09:31:00Z"
    denied = http.post("/v1/checkouts", json={"subject": "org-1", "limit": "cad"}).json()
    assert (denied["state"], denied["allowed"], denied["retry_at"]) == (
        "denied", False, "2026-11-22T09:31:00Z",
    )  # fmt: skip
    checkout_id = body["id"]
    assert http.get(f"/v1/checkouts/{checkout_id}").json()["state"] == "held"
    assert [c["id"] for c in http.get("/v1/checkouts").json()["checkouts"]] == [checkout_id]
    clock.advance(seconds=30)
    renewed = http.post(f"/v1/checkouts/{checkout_id}/renew", params={"ttl_seconds": 120})
    assert renewed.json()["expires_at"] == "2026-11-22T09:32:30Z"
    first = http.delete(f"/v1/checkouts/{checkout_id}").json()
    assert (first["state"], first["released_by"], first["returned"]) == ("released", "checkin", 1)
    assert http.delete(f"/v1/checkouts/{checkout_id}").json()["returned"] == 0
    problem(http.post(f"/v1/checkouts/{checkout_id}/renew"), 409, "checkout-released")
    again = http.post("/v1/checkouts", json={"checkout_id": "c-2", "subject": "org-1",
                                             "limit": "cad"})  # fmt: skip
    assert again.json()["id"] == "c-2"
    clock.advance(minutes=16)  # past its 15 minutes: it is back
    assert http.get("/v1/checkouts/c-2").json()["released_by"] == "expiry"
    assert http.post("/v1/checkouts", json={"subject": "org-1", "limit": "cad"}).json()["allowed"]


@pytest.mark.parametrize(
    ("body", "status", "slug", "field"),
    [
        ({"subject": "org-1", "limit": "calls"}, 400, "invalid-input", "limit"),
        ({"subject": "org-1", "limit": "nope"}, 422, "unknown-limit", "limit"),
        ({"subject": "org-1", "limit": "cad", "cost": 0}, 400, "invalid-input", "cost"),
        ({"subject": "org-1", "limit": "cad", "cost": 1.5}, 400, "invalid-input", "cost"),
        (
            {"subject": "org-1", "limit": "cad", "ttl_seconds": 0},
            400,
            "invalid-input",
            "ttl_seconds",
        ),
        ({"subject": "org-1", "limit": "cad", "ttl": 5}, 400, "invalid-input", None),
        ({"limit": "cad"}, 400, "invalid-input", "subject"),
        (
            {"subject": "org-1", "limit": "cad", "checkout_id": "a b"},
            400,
            "invalid-input",
            "checkout_id",
        ),
    ],
)
def test_bad_input_is_a_problem_and_stores_nothing(
    http: httpx.Client, meter: Meter, body: dict[str, Any], status: int, slug: str,
    field: str | None,
) -> None:  # fmt: skip
    found = problem(http.post("/v1/checkouts", json=body), status, slug)
    if field is not None:
        assert [e["field"] for e in found["errors"]] == [field]
    assert meter.checkouts() == []
    problem(http.delete("/v1/checkouts/nope"), 404, "not-found")
    problem(http.get("/v1/checkouts/nope"), 404, "not-found")
    problem(http.post("/v1/checkouts/nope/renew"), 404, "not-found")


def test_the_routes_are_in_the_openapi_document(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    assert set(paths["/v1/checkouts"]) == {"get", "post"}
    assert set(paths["/v1/checkouts/{checkout_id}"]) == {"get", "delete"}
    assert set(paths["/v1/checkouts/{checkout_id}/renew"]) == {"post"}
    assert "409" in paths["/v1/checkouts/{checkout_id}/renew"]["post"]["responses"]


def test_a_concurrent_limit_is_put_without_a_period(http: httpx.Client) -> None:
    made = http.put("/v1/limits/floating", json={"maximum": 3, "algorithm": "concurrent"})
    assert made.status_code == 200, made.text
    assert (made.json()["algorithm"], made.json()["period"]) == ("concurrent", "")
    body = {"maximum": 3, "algorithm": "concurrent", "period": "1h"}
    found = problem(http.put("/v1/limits/floating2", json=body), 400, "invalid-input")
    assert [e["field"] for e in found["errors"]] == ["period"]
    found = problem(http.put("/v1/limits/windowed", json={"maximum": 3}), 400, "invalid-input")
    assert [e["field"] for e in found["errors"]] == ["period"]
    assert http.get("/v1/limits/floating2").status_code == 404
