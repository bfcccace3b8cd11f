"""Floating licenses over HTTP (in process): POST, GET and DELETE /v1/checkouts,
renew, the problems of bad input, and the routes in the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import hypothesis.errors
import pytest
import schemathesis
from budgets import cases
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
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
        "denied",
        False,
        "2026-11-22T09:31:00Z",
    )
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
    again = http.post(
        "/v1/checkouts", json={"checkout_id": "c-2", "subject": "org-1", "limit": "cad"}
    )
    assert again.json()["id"] == "c-2"
    clock.advance(minutes=16)  # past its 15 minutes: it is back
    assert http.get("/v1/checkouts/c-2").json()["released_by"] == "expiry"
    assert http.post("/v1/checkouts", json={"subject": "org-1", "limit": "cad"}).json()["allowed"]


def test_a_retry_of_an_expired_checkout_is_a_409_naming_it(
    http: httpx.Client, clock: FrozenClock
) -> None:
    job = {"checkout_id": "job-77", "subject": "org-1", "limit": "cad", "ttl_seconds": 1}
    assert http.post("/v1/checkouts", json=job).json()["allowed"]
    assert http.post("/v1/checkouts", json=job).json()["state"] == "held"  # a retry: the same
    clock.advance(seconds=2)
    taken = http.post("/v1/checkouts", json={"subject": "org-1", "limit": "cad"}).json()
    assert taken["allowed"]  # the pool (of 1) is full again
    found = problem(http.post("/v1/checkouts", json=job), 409, "checkout-released")
    ended = (found["checkout_id"], found["released_by"], found["released_at"])
    assert ended == ("job-77", "expiry", "2026-11-22T09:30:01Z")
    assert "'job-77'" in found["detail"] and "new checkout id" in found["detail"]
    stored = http.get("/v1/checkouts/job-77").json()
    assert (stored["state"], stored["allowed"]) == ("released", False)
    listed = [c["id"] for c in http.get("/v1/checkouts").json()["checkouts"]]
    assert listed == [taken["id"], "job-77"]


def test_a_listing_by_state_applies_expiry_first(http: httpx.Client, clock: FrozenClock) -> None:
    held = {"checkout_id": "kept", "subject": "org-1", "limit": "cad", "ttl_seconds": 3600}
    assert http.post("/v1/checkouts", json=held).json()["allowed"]
    clock.advance(seconds=1)
    short = {"checkout_id": "short", "subject": "org-2", "limit": "cad", "ttl_seconds": 5}
    assert http.post("/v1/checkouts", json=short).json()["allowed"]
    clock.advance(seconds=10)  # "short" expired, and no sweep has marked it

    def listed(**params: Any) -> list[tuple[str, str]]:
        answer = http.get("/v1/checkouts", params=params)
        assert answer.status_code == 200, answer.text
        return [(c["id"], c["state"]) for c in answer.json()["checkouts"]]

    assert listed(state="released") == [("short", "released")]
    assert listed(state="held", count=1) == [("kept", "held")]


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
    http: httpx.Client,
    meter: Meter,
    body: dict[str, Any],
    status: int,
    slug: str,
    field: str | None,
) -> None:
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
    for path in ("/v1/checkouts", "/v1/checkouts/{checkout_id}/renew"):
        answer = paths[path]["post"]["responses"]["409"]
        assert "checkout-released" in answer["description"], path
        members = answer["content"][PROBLEM]["schema"]["allOf"][1]["properties"]
        assert set(members) >= {"checkout_id", "released_by", "released_at"}, path


def test_an_ended_checkouts_409_conforms_to_the_document(
    serve_api: Callable[[Any], str], sqlite_url: str, tmp_path: Path
) -> None:
    """The 409s of POST /v1/checkouts (released, conflict) and of renew, checked
    against the OpenAPI document by schemathesis, on a real server."""
    clock = FrozenClock(NOW)
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limit(Limit("cad", maximum=3, algorithm="concurrent"))
        meter.checkout("org-1", "cad", checkout_id="job-77", ttl_seconds=1)
        clock.advance(seconds=2)
        settings_ = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
        base = serve_api(create_api(settings_, meter=meter))
        api_schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        post = api_schema["/v1/checkouts"]["POST"]
        renew = api_schema["/v1/checkouts/{checkout_id}/renew"]["POST"]
        retry = {"checkout_id": "job-77", "subject": "org-1", "limit": "cad"}
        for case in (
            post.Case(body=retry, media_type="application/json"),
            post.Case(body={**retry, "cost": 2}, media_type="application/json"),
            renew.Case(path_parameters={"checkout_id": "job-77"}),
        ):
            answer = case.call_and_validate(checks=CHECKS)
            assert answer.status_code == 409, answer.text


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


SCOPED: list[tuple[str, str, Any, str]] = [
    ("POST", "/v1/checkouts", {"subject": "org-1", "limit": "cad"}, "ingest"),
    ("DELETE", "/v1/checkouts/c-1", None, "ingest"),
    ("POST", "/v1/checkouts/c-1/renew", None, "ingest"),
    ("GET", "/v1/checkouts", None, "read"),
    ("GET", "/v1/checkouts/c-1", None, "read"),
]


def test_each_checkout_route_takes_its_scope(http: httpx.Client, meter: Meter) -> None:
    tokens = {s: ApiKeys(meter).create(s, f"{s} key")[1] for s in ("ingest", "read", "admin")}
    for method, path, body, scope in SCOPED:
        assert problem(http.request(method, path, json=body), 401, "unauthorized")
        for holder, token in tokens.items():
            headers = {"authorization": f"Bearer {token}"}
            answer = http.request(method, path, json=body, headers=headers)
            if scope == holder or holder == "admin":
                assert answer.status_code not in (401, 403), (method, path, holder)
            else:
                problem(answer, 403, "forbidden")
    ingest = {"authorization": f"Bearer {tokens['ingest']}"}
    taken = http.post("/v1/checkouts", json={"subject": "org-9", "limit": "cad"}, headers=ingest)
    assert (taken.json()["allowed"], taken.json()["held"], taken.json()["maximum"]) == (
        True,
        None,
        None,
    )


CHECKS = (
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


def test_schemathesis_no_5xx_and_every_answer_conforms(
    serve_api: Callable[[Any], str], sqlite_url: str, tmp_path: Path
) -> None:
    """Generated requests, valid and invalid by the schema, for every checkout
    route: no 5xx, and every answer is a documented status with its shape."""
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("cad", maximum=3, algorithm="concurrent"))
        settings_ = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
        base = serve_api(create_api(settings_, meter=meter))
        api_schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        seen = 0
        for result in api_schema.get_all_operations():
            operation = result.ok()
            if not operation.path.startswith("/v1/checkouts"):
                continue
            seen += 1
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(
                    max_examples=cases(20),
                    deadline=None,
                    derandomize=True,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                def exchange(case: schemathesis.Case) -> None:
                    case.call_and_validate(checks=CHECKS)

                try:
                    exchange()
                except hypothesis.errors.Unsatisfiable:
                    assert mode == GenerationMode.NEGATIVE
        assert seen == 5
