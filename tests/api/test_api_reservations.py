"""Reservations over HTTP (`metering/api/reservations.py`), on SQLite and
PostgreSQL, under uvicorn (one server for the module: `serve_api_shared`):
reserve, cancel and commit (of less, or more as overdraft), a time to live,
stacked charges all or nothing, a repeated id; bad bodies, listings and ids
are problems naming the field at fault, and store nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import http_client

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.settings import Settings

Serve = Callable[[Any], str]  # the serve_api_shared fixture
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"
LIMITS = (
    Limit("api_calls", maximum=5, period="1h", window="calendar"),
    Limit("seats", maximum=3, period="1mo", window="calendar"),
)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limits(LIMITS)
        yield m


@pytest.fixture
def http(serve_api_shared: Serve, meter: Meter, tmp_path: Path) -> Iterator[httpx.Client]:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    base = serve_api_shared(create_api(settings, meter=meter))
    with http_client(base_url=base, timeout=30) as client:
        yield client


def problem(
    answer: httpx.Response, status: int, slug: str, field: str | None = None, case: str = ""
) -> Any:
    """The problem body, after checking its status, media type, type and field
    (``case`` names the case in a failure)."""
    where = f"{case}: {answer.text}"
    assert answer.status_code == status, where
    assert answer.headers["content-type"] == PROBLEM, where
    body = answer.json()
    assert body["type"] == f"urn:metering:problem:{slug}", where
    assert body["status"] == status, where
    assert body["title"] and body["detail"], where
    if field is not None:
        assert [e["field"] for e in body["errors"]] == [field], where
    return body


def used(meter: Meter, subject: str, limit: str) -> int:
    return sum(c.used for c in meter.counters(subject, limit))


def test_reserve_cancel_then_commit_is_refused(http: httpx.Client, meter: Meter) -> None:
    held = http.post(
        "/v1/reservations",
        json={
            "event_id": "job/42",
            "subject": "org-1",
            "limit": "api_calls",
            "cost": 2,
            "ttl_seconds": 120,
        },
    )
    assert held.status_code == 200
    body = held.json()
    assert (body["id"], body["state"], body["allowed"], body["duplicate"]) == (
        "job/42",
        "held",
        True,
        False,
    )
    assert body["expires_at"] == (NOW + timedelta(seconds=120)).isoformat()
    assert (body["decision"]["used"], body["decision"]["remaining"]) == (2, 3)
    assert used(meter, "org-1", "api_calls") == 2

    listed = http.get("/v1/reservations").json()["reservations"]
    assert listed == [
        {
            "id": "job/42",
            "state": "held",
            "charges": [{"subject": "org-1", "limit": "api_calls", "cost": 2, "given_back": 0}],
            "created_at": NOW.isoformat(),
            "expires_at": (NOW + timedelta(seconds=120)).isoformat(),
            "settled_at": None,
            "settled_by": None,
        }
    ]
    # An id with a slash, as it is or percent-encoded.
    assert http.get("/v1/reservations/job/42").json() == listed[0]
    assert http.get("/v1/reservations/job%2F42").json() == listed[0]

    cancelled = http.post("/v1/reservations/job/42/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json() == {
        **listed[0],
        "charges": [{"subject": "org-1", "limit": "api_calls", "cost": 2, "given_back": 2}],
        "state": "cancelled",
        "settled_at": NOW.isoformat(),
        "settled_by": "cancel",
        "returned": 2,
    }
    assert used(meter, "org-1", "api_calls") == 0
    again = http.post("/v1/reservations/job/42/cancel")
    assert (again.status_code, again.json()["returned"]) == (200, 0)

    refused = problem(http.post("/v1/reservations/job/42/commit"), 409, "reservation-settled")
    assert refused["state"] == "cancelled"
    assert "cancelled" in refused["detail"]
    info = meter.reservation("job/42")
    assert info is not None and info.state == "cancelled"


def test_commit_is_final_and_a_cancel_after_it_is_409(http: httpx.Client, meter: Meter) -> None:
    http.post("/v1/reservations", json={"event_id": "r-1", "subject": "org-1", "limit": "seats"})
    committed = http.post("/v1/reservations/r-1/commit")
    assert committed.status_code == 200
    assert (committed.json()["state"], committed.json()["settled_by"]) == ("committed", "commit")
    assert http.post("/v1/reservations/r-1/commit").status_code == 200  # again: no change
    refused = problem(http.post("/v1/reservations/r-1/cancel"), 409, "reservation-settled")
    assert refused["state"] == "committed"
    assert used(meter, "org-1", "seats") == 1


def test_commit_with_the_actual_amount_gives_the_rest_back(
    http: httpx.Client, meter: Meter
) -> None:
    body = {"event_id": "r-2", "subject": "org-1", "limit": "api_calls", "cost": 3}
    assert http.post("/v1/reservations", json=body).status_code == 200
    too_much = {"actual": 10**12 + 1}
    problem(http.post("/v1/reservations/r-2/commit", params=too_much), 400, "invalid-input")
    assert http.post("/v1/reservations/r-2/commit", params={"actual": -1}).status_code == 400
    assert used(meter, "org-1", "api_calls") == 3
    committed = http.post("/v1/reservations/r-2/commit", params={"actual": 1})
    assert committed.status_code == 200, committed.text
    answer = committed.json()
    assert (answer["state"], answer["returned"]) == ("committed", 2)
    assert answer["charges"][0]["given_back"] == 2
    assert used(meter, "org-1", "api_calls") == 1
    again = http.post("/v1/reservations/r-2/commit", params={"actual": 1})
    assert (again.status_code, again.json()["returned"]) == (200, 0)


def test_a_commit_of_more_than_reserved_charges_the_excess_as_overdraft(
    http: httpx.Client, meter: Meter
) -> None:
    body = {"event_id": "r-3", "subject": "org-1", "limit": "api_calls", "cost": 2}
    assert http.post("/v1/reservations", json=body).status_code == 200
    committed = http.post("/v1/reservations/r-3/commit", params={"actual": 8})
    assert committed.status_code == 200, committed.text
    assert (committed.json()["state"], committed.json()["returned"]) == ("committed", 0)
    assert used(meter, "org-1", "api_calls") == 8
    [charge] = http.get("/v1/events/r-3").json()["charges"]
    assert (charge["cost"], charge["overdraft"]) == (8, 3)  # a maximum of 5


def test_a_cancel_past_the_time_to_live_is_409_committed(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    http.post(
        "/v1/reservations",
        json={
            "event_id": "r-2",
            "subject": "org-1",
            "limit": "api_calls",
            "cost": 3,
            "ttl_seconds": 30,
        },
    )
    clock.advance(seconds=31)
    refused = problem(http.post("/v1/reservations/r-2/cancel"), 409, "reservation-settled")
    assert refused["state"] == "committed"
    assert "time to live" in refused["detail"] and "committed" in refused["detail"]
    stored = http.get("/v1/reservations/r-2").json()
    assert (stored["state"], stored["settled_by"]) == ("committed", "expiry")
    assert used(meter, "org-1", "api_calls") == 3


def test_stacked_reservations_are_all_or_nothing(http: httpx.Client, meter: Meter) -> None:
    both = [
        {"subject": "org-1", "limit": "api_calls", "cost": 2},
        {"subject": "org-1", "limit": "seats", "cost": 1},
    ]
    held = http.post("/v1/reservations", json={"event_id": "s-1", "charges": both}).json()
    assert held["state"] == "held" and len(held["decision"]["charges"]) == 2

    too_many = [
        {"subject": "org-2", "limit": "api_calls", "cost": 1},
        {"subject": "org-2", "limit": "seats", "cost": 9},
    ]
    denied = http.post("/v1/reservations", json={"event_id": "s-2", "charges": too_many})
    assert denied.status_code == 200
    assert denied.json()["state"] == "denied" and denied.json()["allowed"] is False
    assert denied.json()["expires_at"] is None
    assert denied.json()["decision"]["denied_by"] == ["seats"]
    problem(http.get("/v1/reservations/s-2"), 404, "not-found")  # a denial stores no reservation
    assert [i.id for i in meter.reservations()] == ["s-1"]
    assert used(meter, "org-2", "api_calls") == used(meter, "org-2", "seats") == 0


def test_a_repeated_id_answers_the_same_reservation(http: httpx.Client, meter: Meter) -> None:
    first = http.post(
        "/v1/reservations", json={"event_id": "r-9", "subject": "org-1", "limit": "api_calls"}
    ).json()
    again = http.post(
        "/v1/reservations", json={"event_id": "r-9", "subject": "org-1", "limit": "api_calls"}
    ).json()
    assert (again["state"], again["duplicate"], again["expires_at"]) == (
        "held",
        True,
        first["expires_at"],
    )
    other = http.post(
        "/v1/reservations",
        json={"event_id": "r-9", "subject": "org-1", "limit": "api_calls", "cost": 2},
    )
    assert problem(other, 409, "conflict")["event_ids"] == ["r-9"]
    assert used(meter, "org-1", "api_calls") == 1


def _reserve(**fields: Any) -> bytes:
    return json.dumps({"subject": "org-1", "limit": "api_calls", **fields}).encode()


# (id, content type, body, status, problem type, field)
BAD_RESERVATIONS: list[tuple[str, str | None, bytes, int, str, str | None]] = [
    ("no content type", None, _reserve(), 415, "unsupported-media-type", None),
    ("text/plain", "text/plain", _reserve(), 415, "unsupported-media-type", None),
    ("not json", "application/json", b"{nope", 400, "invalid-input", "body"),
    ("empty", "application/json", b"", 400, "invalid-input", "body"),
    ("an array", "application/json", b"[]", 400, "invalid-input", "body"),
    (
        "NaN ttl",
        "application/json",
        b'{"subject": "a", "limit": "api_calls", "ttl_seconds": NaN}',
        400,
        "invalid-input",
        "body",
    ),
    ("unknown field", "application/json", _reserve(colour="red"), 400, "invalid-input", "colour"),
    (
        "occurred_at",
        "application/json",
        _reserve(occurred_at=NOW.isoformat()),
        400,
        "invalid-input",
        "occurred_at",
    ),
    ("zero ttl", "application/json", _reserve(ttl_seconds=0), 400, "invalid-input", "ttl_seconds"),
    (
        "eight days",
        "application/json",
        _reserve(ttl_seconds=8 * 86_400),
        400,
        "invalid-input",
        "ttl_seconds",
    ),
    (
        "string ttl",
        "application/json",
        _reserve(ttl_seconds="60"),
        400,
        "invalid-input",
        "ttl_seconds",
    ),
    ("zero cost", "application/json", _reserve(cost=0), 400, "invalid-input", "cost"),
    ("huge cost", "application/json", _reserve(cost=10**30), 400, "invalid-input", "cost"),
    (
        "bad id",
        "application/json",
        _reserve(event_id="has space"),
        400,
        "invalid-input",
        "event_id",
    ),
    ("no limit", "application/json", b'{"subject": "org-1"}', 400, "invalid-input", "limit"),
    (
        "both forms",
        "application/json",
        _reserve(charges=[{"subject": "a", "limit": "seats"}]),
        400,
        "invalid-input",
        "charges",
    ),
    (
        "bad charge",
        "application/json",
        json.dumps(
            {
                "charges": [
                    {"subject": "a", "limit": "seats"},
                    {"subject": "a", "limit": "api_calls", "cost": -1},
                ]
            }
        ).encode(),
        400,
        "invalid-input",
        "charges[1].cost",
    ),
    (
        "big metadata",
        "application/json",
        _reserve(metadata={"x": "y" * 9000}),
        400,
        "invalid-input",
        "metadata",
    ),
    ("unknown limit", "application/json", _reserve(limit="nope"), 422, "unknown-limit", "limit"),
    (
        "unknown stacked limit",
        "application/json",
        json.dumps(
            {"charges": [{"subject": "a", "limit": "seats"}, {"subject": "a", "limit": "nope"}]}
        ).encode(),
        422,
        "unknown-limit",
        "charges[1].limit",
    ),
]


def test_a_bad_reservation_is_a_problem_and_stores_nothing(
    http: httpx.Client, meter: Meter
) -> None:
    for case, content_type, body, status, slug, field in BAD_RESERVATIONS:
        headers = {"content-type": content_type} if content_type else {}
        answer = http.post("/v1/reservations", content=body, headers=headers)
        problem(answer, status, slug, field, case)
        assert meter.reservations() == [], case
        assert meter.count_results() == 0, case
        assert meter.counters() == [], case


def test_listing_filters_and_bounds(http: httpx.Client, meter: Meter, clock: FrozenClock) -> None:
    for name, subject in (("a", "org-1"), ("b", "org-2"), ("c", "org-1")):
        http.post("/v1/reservations", json={"event_id": name, "subject": subject, "limit": "seats"})
        clock.advance(seconds=1)
    http.post("/v1/reservations/b/commit")

    def ids(**params: Any) -> list[str]:
        answer = http.get("/v1/reservations", params=params)
        assert answer.status_code == 200
        return [r["id"] for r in answer.json()["reservations"]]

    assert ids() == ["c", "b", "a"]
    assert ids(state="held") == ["c", "a"]
    assert ids(state="committed") == ["b"]
    assert ids(subject="org-1") == ["c", "a"]
    assert ids(subject="org-1", count=1) == ["c"]
    for params, field in [
        ({"state": "lost"}, "state"),
        ({"count": 0}, "count"),
        ({"count": 1001}, "count"),
        ({"count": "ten"}, "count"),
        ({"subject": " org-1"}, "subject"),
    ]:
        problem(http.get("/v1/reservations", params=params), 400, "invalid-input", field)


@pytest.mark.parametrize(
    ("method", "template"),
    [
        ("GET", "/v1/reservations/{}"),
        ("POST", "/v1/reservations/{}/cancel"),
        ("POST", "/v1/reservations/{}/commit"),
    ],
)
def test_unknown_and_malformed_reservation_ids(
    http: httpx.Client, meter: Meter, method: str, template: str
) -> None:
    problem(http.request(method, template.format("never-made")), 404, "not-found")
    malformed = http.request(method, template.format("has%20space"))
    problem(malformed, 400, "invalid-input", "reservation_id")
    assert meter.reservations() == []
