"""Entitlements, grants, corrections, shadow limits and absolute thresholds over HTTP.

The API runs under uvicorn on a loopback port (`serve_api`), driven with
httpx, on PostgreSQL and on SQLite (`db_url`), with a frozen clock shared
with the test's `Meter`. Success answers are checked whole; each bad input
is a problem naming its field, and the library shows that nothing was
stored. Last, the routes' scopes, their shapes in ``/openapi.json`` and a
schemathesis pass over them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from budgets import cases
from hypothesis import HealthCheck, given, settings
from lock_waits import wait_until_waiting
from loopback import http_client
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import text

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
from metering.settings import Settings

Serve = Callable[[Any], str]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"
LIMITS = (
    Limit("api_calls", maximum=5, period="1h", window="calendar"),
    Limit("burst", maximum=10, period="10s", algorithm="token_bucket"),
)
PREFIXES = (
    "/v1/entitlements",
    "/v1/grants",
    "/v1/corrections",
    "/v1/alerts",
    "/v1/recurring-grants",
    "/v1/events/{event_id}/void",
)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limits(LIMITS)
        yield m


def serve(serve_api: Serve, meter: Meter, tmp_path: Path) -> httpx.Client:
    settings_ = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    return http_client(base_url=serve_api(create_api(settings_, meter=meter)), timeout=30)


@pytest.fixture
def http(serve_api: Serve, meter: Meter, tmp_path: Path) -> Iterator[httpx.Client]:
    with serve(serve_api, meter, tmp_path) as client:
        yield client


def problem(
    answer: httpx.Response, status: int, slug: str, field: str | None = None, case: str = ""
) -> Any:
    where = f"{case}: {answer.text}"
    assert answer.status_code == status, where
    assert answer.headers["content-type"] == PROBLEM, where
    body = answer.json()
    assert body["type"] == f"urn:metering:problem:{slug}", where
    assert (body["status"], bool(body["title"]), bool(body["detail"])) == (status, True, True)
    if field is not None:
        assert [e["field"] for e in body["errors"]] == [field], where
    return body


def used(meter: Meter, subject: str, limit: str) -> int:
    return sum(c.used for c in meter.counters(subject, limit))


# -- entitlements -------------------------------------------------------------------


def test_an_entitlement_is_set_listed_and_returned_to_the_default(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    for _ in range(5):
        assert meter.consume("org-1", "api_calls").allowed
    assert not meter.consume("org-1", "api_calls").allowed

    # An upgrade mid-window applies from now on; the window's 5 carry over.
    upgraded = http.put("/v1/entitlements/org-1/api_calls", json={"maximum": 8})
    assert upgraded.status_code == 200
    change = {
        "subject": "org-1",
        "limit": "api_calls",
        "maximum": 8,
        "effective_from": NOW.isoformat(),
        "created_at": NOW.isoformat(),
    }
    assert upgraded.json() == change
    decision = meter.consume("org-1", "api_calls", cost=3)
    assert (decision.allowed, decision.used, decision.maximum) == (True, 8, 8)

    later = (NOW + timedelta(days=1)).isoformat()
    back = http.delete("/v1/entitlements/org-1/api_calls", params={"effective_from": later})
    assert back.status_code == 200
    assert back.json() == {**change, "maximum": None, "effective_from": later}
    # A subject holding a slash, as it is or percent-encoded.
    http.put("/v1/entitlements/team/7/api_calls", json={"maximum": 2, "effective_from": later})
    http.put("/v1/entitlements/team%2F8/api_calls", json={"maximum": 3})

    listed = http.get("/v1/entitlements").json()["entitlements"]
    assert [(e["subject"], e["maximum"]) for e in listed] == [
        ("org-1", 8),
        ("org-1", None),
        ("team/7", 2),
        ("team/8", 3),
    ]
    assert listed == [e.to_dict() for e in meter.entitlements()]
    only = http.get("/v1/entitlements", params={"subject": "team/7", "limit": "api_calls"})
    assert [e["maximum"] for e in only.json()["entitlements"]] == [2]
    assert http.get("/v1/entitlements", params={"limit": "burst"}).json() == {"entitlements": []}

    clock.advance(days=1)
    assert meter.check("org-1", "api_calls").maximum == 5


BAD_ENTITLEMENTS: list[tuple[str, str, Any, str]] = [
    ("no maximum", "org-1/api_calls", {}, "maximum"),
    ("null maximum", "org-1/api_calls", {"maximum": None}, "maximum"),
    ("zero maximum", "org-1/api_calls", {"maximum": 0}, "maximum"),
    ("fractional maximum", "org-1/api_calls", {"maximum": 1.5}, "maximum"),
    ("string maximum", "org-1/api_calls", {"maximum": "5"}, "maximum"),
    ("huge maximum", "org-1/api_calls", {"maximum": 10**16}, "maximum"),
    ("bad time", "org-1/api_calls", {"maximum": 5, "effective_from": "soon"}, "effective_from"),
    ("number time", "org-1/api_calls", {"maximum": 5, "effective_from": 5}, "effective_from"),
    (
        "time out of range",
        "org-1/api_calls",
        {"maximum": 5, "effective_from": "0001-01-01T00:00:00+01:00"},
        "effective_from",
    ),
    ("unknown field", "org-1/api_calls", {"maximum": 5, "max": 5}, "max"),
    ("an array", "org-1/api_calls", [{"maximum": 5}], "body"),
    ("edge space subject", "%20org-1/api_calls", {"maximum": 5}, "subject"),
    ("bad limit name", "org-1/API%20calls", {"maximum": 5}, "limit"),
]


def test_a_bad_entitlement_is_400_naming_the_field_and_nothing_is_stored(
    http: httpx.Client, meter: Meter
) -> None:
    for case, path, body, field in BAD_ENTITLEMENTS:
        answer = http.put(f"/v1/entitlements/{path}", json=body)
        problem(answer, 400, "invalid-input", field, case)
    unknown = http.put("/v1/entitlements/org-1/nope", json={"maximum": 5})
    problem(unknown, 422, "unknown-limit", "limit")
    text = http.put("/v1/entitlements/org-1/api_calls", content=b"maximum=5")
    problem(text, 415, "unsupported-media-type")
    problem(
        http.delete("/v1/entitlements/org-1/api_calls", params={"effective_from": "soon"}),
        400,
        "invalid-input",
        "effective_from",
    )
    problem(http.delete("/v1/entitlements/org-1/nope"), 422, "unknown-limit", "limit")
    problem(http.get("/v1/entitlements", params={"limit": "Nope"}), 400, "invalid-input", "limit")
    problem(http.get("/v1/entitlements", params={"subject": ""}), 400, "invalid-input", "subject")
    assert meter.entitlements() == []


# -- grants ---------------------------------------------------------------------------


def test_a_grant_is_added_once_and_a_conflicting_one_is_409(
    http: httpx.Client, meter: Meter
) -> None:
    expires = (NOW + timedelta(days=30)).isoformat()
    body = {
        "subject": "org-1",
        "limit": "api_calls",
        "amount": 3,
        "expires_at": expires,
        "grant_id": "promo-1",
        "reason": "launch promotion",
    }
    created = http.post("/v1/grants", json=body)
    assert created.status_code == 201, created.text
    grant = {
        "grant_id": "promo-1",
        "subject": "org-1",
        "limit": "api_calls",
        "amount": 3,
        "used": 0,
        "left": 3,
        "effective_from": NOW.isoformat(),
        "expires_at": expires,
        "reason": "launch promotion",
        "priority": 100,
        "recurring_grant_id": None,
        "issue": None,
        "low_at": None,
    }
    assert created.json() == {**grant, "duplicate": False}
    again = http.post("/v1/grants", json=body)
    assert (again.status_code, again.json()) == (200, {**grant, "duplicate": True})
    conflict = http.post("/v1/grants", json={**body, "amount": 4})
    assert "promo-1" in problem(conflict, 409, "grant-conflict", "grant_id")["detail"]

    # The window's own 5 first, then the grant.
    decision = meter.consume("org-1", "api_calls", cost=7)
    assert decision.allowed and decision.charges[0].grants == (("promo-1", 2),)
    listed = http.get("/v1/grants", params={"subject": "org-1"}).json()["grants"]
    assert listed == [{**grant, "used": 2, "left": 1}]
    generated = http.post(
        "/v1/grants", json={"subject": "org-2", "limit": "api_calls", "amount": 1}
    )
    assert generated.status_code == 201 and generated.json()["grant_id"]
    assert len(http.get("/v1/grants").json()["grants"]) == 2
    assert http.get("/v1/grants", params={"limit": "burst"}).json() == {"grants": []}


GRANT = {"subject": "org-1", "limit": "api_calls", "amount": 3}
BAD_GRANTS: list[tuple[str, Any, str]] = [
    ("no subject", {"limit": "api_calls", "amount": 3}, "subject"),
    ("no limit", {"subject": "org-1", "amount": 3}, "limit"),
    ("no amount", {"subject": "org-1", "limit": "api_calls"}, "amount"),
    ("number subject", {**GRANT, "subject": 7}, "subject"),
    ("bad limit name", {**GRANT, "limit": "API calls"}, "limit"),
    ("zero amount", {**GRANT, "amount": 0}, "amount"),
    ("string amount", {**GRANT, "amount": "3"}, "amount"),
    ("huge amount", {**GRANT, "amount": 10**16}, "amount"),
    ("bad expiry", {**GRANT, "expires_at": "next month"}, "expires_at"),
    ("expiry before start", {**GRANT, "expires_at": "2026-11-01T00:00:00Z"}, "expires_at"),
    ("bad start", {**GRANT, "effective_from": []}, "effective_from"),
    ("bad grant id", {**GRANT, "grant_id": "bad id!"}, "grant_id"),
    ("empty reason", {**GRANT, "reason": " "}, "reason"),
    ("number reason", {**GRANT, "reason": 5}, "reason"),
    ("long reason", {**GRANT, "reason": "x" * 501}, "reason"),
    ("token bucket", {**GRANT, "limit": "burst"}, "limit"),
    ("unknown field", {**GRANT, "cost": 1}, "cost"),
    ("an array", [GRANT], "body"),
]


def test_a_bad_grant_is_a_problem_naming_the_field_and_none_is_stored(
    http: httpx.Client, meter: Meter
) -> None:
    for case, body, field in BAD_GRANTS:
        problem(http.post("/v1/grants", json=body), 400, "invalid-input", field, case)
    unknown = http.post("/v1/grants", json={**GRANT, "limit": "nope"})
    problem(unknown, 422, "unknown-limit", "limit")
    problem(http.post("/v1/grants", content=b"amount=3"), 415, "unsupported-media-type")
    problem(http.get("/v1/grants", params={"limit": "Nope"}), 400, "invalid-input", "limit")
    assert meter.grants() == []


# -- corrections ------------------------------------------------------------------------


def test_a_void_gives_back_once_and_a_denied_event_cannot_be_voided(
    http: httpx.Client, meter: Meter
) -> None:
    meter.grant("org-1", "api_calls", 2, grant_id="g-1")
    assert meter.consume("org-1", "api_calls", cost=6, event_id="job/1").allowed
    assert not meter.consume("org-1", "api_calls", cost=9, event_id="job-2").allowed
    assert used(meter, "org-1", "api_calls") == 6

    voided = http.post(
        "/v1/events/job/1/void", json={"reason": "duplicate upload", "correction_id": "c-1"}
    )
    assert voided.status_code == 201, voided.text
    correction = {
        "correction_id": "c-1",
        "event_id": "job/1",
        "reason": "duplicate upload",
        "created_at": NOW.isoformat(),
        "charges": [
            {
                "subject": "org-1",
                "limit": "api_calls",
                "cost": 6,
                "window_start": NOW.replace(minute=0).isoformat(),
                "grants": [{"grant_id": "g-1", "amount": 1}],
            }
        ],
    }
    assert voided.json() == {**correction, "duplicate": False}
    assert used(meter, "org-1", "api_calls") == 0
    assert meter.grants()[0].used == 0
    result = meter.result("job/1")
    assert result is not None and result.outcome == "allowed"  # the result stays

    again = http.post("/v1/events/job%2F1/void", json={"reason": "again"})
    assert (again.status_code, again.json()) == (200, {**correction, "duplicate": True})
    assert used(meter, "org-1", "api_calls") == 0

    denied = http.post("/v1/events/job-2/void", json={"reason": "refund"})
    assert "denied" in problem(denied, 409, "correction-refused", "event_id")["detail"]
    assert meter.consume("org-1", "api_calls", event_id="job-3").allowed
    reused = http.post("/v1/events/job-3/void", json={"reason": "x", "correction_id": "c-1"})
    problem(reused, 409, "correction-conflict", "correction_id")
    problem(http.post("/v1/events/never/void", json={"reason": "x"}), 404, "not-found")

    listed = http.get("/v1/corrections").json()
    assert listed == {"corrections": [correction]}
    assert http.get("/v1/corrections", params={"count": 1}).json() == listed
    assert used(meter, "org-1", "api_calls") == 1


@pytest.mark.postgres
def test_voids_of_one_event_at_once_are_one_correction(
    serve_api: Serve, pg_url: str, clock: FrozenClock, tmp_path: Path
) -> None:
    """Clients voiding one grant-paid event at once, under other correction
    ids, while its counter is locked: one void gives back, the others answer
    it (200, ``duplicate``), never a grant given back twice (a 422). (The
    pool holds the blocker, the watcher and the three voids.)"""
    with (
        Meter(pg_url, clock=clock, connections=20) as meter,
        serve(serve_api, meter, tmp_path) as http,
    ):
        meter.set_limits(LIMITS)
        meter.grant("org-1", "api_calls", 5, grant_id="g-1")
        assert meter.consume("org-1", "api_calls", cost=7, event_id="job-1").allowed

        def void(n: int) -> httpx.Response:
            body = {"reason": "refund", "correction_id": f"c-{n}"}
            return http.post("/v1/events/job-1/void", json=body)

        with meter.sql_engine.connect() as other, meter.sql_engine.connect() as watcher:
            other.execute(text("SELECT used FROM counters WHERE subject = 'org-1' FOR UPDATE"))
            with ThreadPoolExecutor(3) as pool:
                voiding = [pool.submit(void, n) for n in range(3)]
                wait_until_waiting(watcher, 3, "the voids")
                other.rollback()
                answers = [future.result() for future in voiding]
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 200, 201], [a.text for a in answers]
        [first] = [a.json() for a in answers if a.status_code == 201]
        again = [a.json() for a in answers if a.status_code == 200]
        assert again == [{**first, "duplicate": True}] * 2
        assert (used(meter, "org-1", "api_calls"), meter.grants()[0].used) == (0, 0)
        assert [c.correction_id for c in meter.corrections()] == [first["correction_id"]]


BAD_VOIDS: list[tuple[str, str, Any, str]] = [
    ("no reason", "job-1", {}, "reason"),
    ("empty reason", "job-1", {"reason": ""}, "reason"),
    ("number reason", "job-1", {"reason": 5}, "reason"),
    ("control characters", "job-1", {"reason": "a\nb"}, "reason"),
    ("bad correction id", "job-1", {"reason": "x", "correction_id": "a b"}, "correction_id"),
    ("number correction id", "job-1", {"reason": "x", "correction_id": 5}, "correction_id"),
    ("unknown field", "job-1", {"reason": "x", "horizon": "1d"}, "horizon"),
    ("not an object", "job-1", "refund", "body"),
    ("bad event id", "bad%20id!", {"reason": "x"}, "event_id"),
]


def test_a_bad_void_is_400_and_nothing_changes(http: httpx.Client, meter: Meter) -> None:
    assert meter.consume("org-1", "api_calls", cost=2, event_id="job-1").allowed
    for case, event_id, body, field in BAD_VOIDS:
        answer = http.post(f"/v1/events/{event_id}/void", json=body)
        problem(answer, 400, "invalid-input", field, case)
    problem(http.post("/v1/events/job-1/void", content=b"x"), 415, "unsupported-media-type")
    for count in (0, 1001, "many"):
        answer = http.get("/v1/corrections", params={"count": count})
        problem(answer, 400, "invalid-input", "count")
    assert meter.corrections() == []
    assert used(meter, "org-1", "api_calls") == 2


# -- shadow limits and absolute thresholds ------------------------------------------------


def test_a_shadow_limit_with_absolute_thresholds_round_trips(
    http: httpx.Client, meter: Meter
) -> None:
    definition = {"maximum": 2, "period": "1h", "enforcement": "shadow", "thresholds_units": [2, 1]}
    stored = {
        "name": "trial",
        "maximum": 2,
        "period": "1h",
        "algorithm": "fixed_window",
        "window": "first_use",
        "enforcement": "shadow",
        "thresholds": [],
        "lateness": "1d",
        "thresholds_units": [1, 2],
        "dimensions": [],
        "distinct": None,
        "aggregation": "sum",
    }
    created = http.put("/v1/limits/trial", json=definition)
    assert (created.status_code, created.json()) == (200, stored)
    assert http.get("/v1/limits/trial").json() == stored
    limit = meter.get_limit("trial")
    assert (limit.enforcement, limit.thresholds_units) == ("shadow", (1, 2))

    outcomes = [meter.consume("org-1", "trial") for _ in range(3)]
    assert [d.allowed for d in outcomes] == [True, True, True]
    assert outcomes[2].would_deny == ("trial",)
    assert outcomes[2].charges[0].outcome == "would_deny"

    for body, field in [
        ({**definition, "thresholds_units": [0]}, "thresholds_units"),
        ({**definition, "thresholds_units": "5"}, "thresholds_units"),
        ({**definition, "thresholds_units": [10**16]}, "thresholds_units"),
        ({**definition, "enforcement": "dry-run"}, "enforcement"),
    ]:
        problem(http.put("/v1/limits/trial", json=body), 400, "invalid-input", field)
    assert meter.get_limit("trial") == limit


# -- recurring grants and per-subject alerts (issue 22) ---------------------------------


def test_a_recurring_grant_and_a_subjects_alerts_over_http(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    body = {
        "subject": "org-1",
        "limit": "api_calls",
        "amount": 3,
        "every": "1h",
        "rollover_max": 2,
        "priority": 10,
        "low": "50%",
        "grant_id": "hourly",
    }
    created = http.post("/v1/grants", json=body)
    assert created.status_code == 201, created.text
    found = created.json()
    assert (found["recurring_grant_id"], found["issue"], found["low_at"]) == ("hourly", 1, 1)
    assert found["expires_at"] == "2026-11-22T10:00:00+00:00"  # the calendar hour's end
    assert http.post("/v1/grants", json=body).json()["duplicate"] is True
    clock.set(NOW + timedelta(hours=1))
    [recurring] = http.get("/v1/recurring-grants").json()["recurring_grants"]
    assert (recurring["last_issue"], recurring["next_issue_at"]) == (
        2,
        "2026-11-22T11:00:00+00:00",
    )
    issues = [(g["grant_id"], g["amount"]) for g in http.get("/v1/grants").json()["grants"]]
    assert issues == [("hourly", 3), ("hourly/2", 5)]  # 3 + 2 carried over
    answer = http.put("/v1/alerts/org-1/api_calls", json={"at": ["80%", 4]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["at"] == ["80%", "4"]
    assert [a["subject"] for a in http.get("/v1/alerts").json()["alerts"]] == ["org-1"]
    removed = http.delete("/v1/alerts/org-1/api_calls")
    assert removed.json() == {"subject": "org-1", "limit": "api_calls", "removed": True}
    assert meter.alerts() == []


def test_recurring_grants_and_alerts_refuse_bad_input_over_http(
    http: httpx.Client, meter: Meter
) -> None:
    base = {"subject": "org-1", "limit": "api_calls", "amount": 3}
    for body, field in [
        ({**base, "limit": "burst", "every": "1h"}, "limit"),
        ({**base, "rollover_max": 2}, "rollover_max"),
        ({**base, "every": "1h", "rollover_max": -2}, "rollover_max"),
        ({**base, "every": "hourly"}, "every"),
        ({**base, "every": 5}, "every"),
        ({**base, "amount": -3, "every": "1h"}, "amount"),
        ({**base, "priority": 1.5}, "priority"),
        ({**base, "low": "half"}, "low"),
        ({**base, "until": "2030-01-01T00:00:00Z"}, "until"),
    ]:
        problem(http.post("/v1/grants", json=body), 400, "invalid-input", field, case=str(body))
    for body in [{"at": []}, {"at": ["0%"]}, {"at": "80%"}, {}, {"at": ["80%"], "x": 1}]:
        answer = http.put("/v1/alerts/org-1/api_calls", json=body)
        assert answer.status_code == 400, (body, answer.text)
    assert (meter.grants(), meter.recurring_grants(), meter.alerts()) == ([], [], [])


# -- scopes and the schema --------------------------------------------------------------

SCOPED: list[tuple[str, str, Any, str]] = [
    ("PUT", "/v1/entitlements/org-1/api_calls", {"maximum": 9}, "admin"),
    ("DELETE", "/v1/entitlements/org-1/api_calls", None, "admin"),
    ("GET", "/v1/entitlements", None, "read"),
    ("POST", "/v1/grants", GRANT, "admin"),
    ("GET", "/v1/grants", None, "read"),
    ("POST", "/v1/events/job-1/void", {"reason": "x"}, "admin"),
    ("GET", "/v1/corrections", None, "read"),
    ("GET", "/v1/recurring-grants", None, "read"),
    ("PUT", "/v1/alerts/org-1/api_calls", {"at": ["80%"]}, "admin"),
    ("DELETE", "/v1/alerts/org-1/api_calls", None, "admin"),
    ("GET", "/v1/alerts", None, "read"),
]


def test_each_route_takes_its_scope(http: httpx.Client, meter: Meter) -> None:
    keys = ApiKeys(meter)
    tokens = {scope: keys.create(scope, f"{scope} key")[1] for scope in ("ingest", "read", "admin")}
    for method, path, body, scope in SCOPED:
        case = f"{method} {path}"
        problem(http.request(method, path, json=body), 401, "unauthorized", case=case)
        for holder, token in tokens.items():
            headers = {"authorization": f"Bearer {token}"}
            answer = http.request(method, path, json=body, headers=headers)
            if scope == holder or holder == "admin":
                assert answer.status_code not in (401, 403), f"{case} with {holder}: {answer.text}"
            else:
                problem(answer, 403, "forbidden", case=f"{case} with {holder}")


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in schema["paths"].items():
        if path.startswith(PREFIXES[:-1]) or path == PREFIXES[-1]:
            for method, operation in operations.items():
                yield method, path, operation


def test_every_answer_has_its_shape_in_the_schema(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    found = {f"{method.upper()} {path}" for method, path, _ in _operations(schema)}
    assert found == {f"{method} {path}" for method, path, _, _ in SCOPED} - {
        "PUT /v1/entitlements/org-1/api_calls",
        "DELETE /v1/entitlements/org-1/api_calls",
        "POST /v1/events/job-1/void",
        "PUT /v1/alerts/org-1/api_calls",
        "DELETE /v1/alerts/org-1/api_calls",
    } | {
        "PUT /v1/entitlements/{subject}/{limit}",
        "DELETE /v1/entitlements/{subject}/{limit}",
        "POST /v1/events/{event_id}/void",
        "PUT /v1/alerts/{subject}/{limit}",
        "DELETE /v1/alerts/{subject}/{limit}",
    }
    for method, path, operation in _operations(schema):
        answers = operation["responses"]
        assert {"401", "403", "413", "500", "503"} <= set(answers), (method, path)
        for status, answer in answers.items():
            content = answer.get("content", {})
            if int(status) >= 400:
                assert list(content) == [PROBLEM], (method, path, status)
            else:
                shape = content["application/json"]["schema"]
                assert shape.get("$ref", "").startswith("#/components/schemas/"), (method, path)
        if method in ("post", "put"):
            body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
            assert "$ref" not in json.dumps(body_schema)
    grants = schema["paths"]["/v1/grants"]["post"]["responses"]
    assert {"200", "201", "409"} <= set(grants)


CHECKS = (
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


def test_schemathesis_no_5xx_and_every_answer_conforms(
    serve_api: Serve, sqlite_url: str, tmp_path: Path
) -> None:
    """Generated requests, valid and invalid by the schema, for these
    operations (on SQLite: the rules are the library's, the same on both)."""
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(LIMITS)
        meter.consume("org-1", "api_calls", event_id="job-1")
        with serve(serve_api, meter, tmp_path) as http:
            api_schema = schemathesis.openapi.from_url(f"{http.base_url}/openapi.json")
            seen = 0
            for result in api_schema.get_all_operations():
                operation = result.ok()
                if not (operation.path.startswith(PREFIXES[:-1]) or operation.path == PREFIXES[-1]):
                    continue
                seen += 1
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                    @given(case=operation.as_strategy(generation_mode=mode))
                    @settings(
                        max_examples=cases(20),
                        deadline=None,
                        suppress_health_check=list(HealthCheck),
                        derandomize=True,
                        database=None,
                    )
                    def exchange(case: schemathesis.Case) -> None:
                        case.call_and_validate(checks=CHECKS)

                    exchange()
            assert seen == 11
