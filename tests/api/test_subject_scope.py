"""A customer's key (``read`` limited to one subject) over HTTP, SQLite and PostgreSQL.

The walk: every operation of the OpenAPI document, called with the customer
key of ``org-1`` and with ``org-2`` wherever the route takes a subject (its
path, its ``subject`` query parameter, its body), answers 404 or a body
that names no ``org-2``; and nothing of ``org-2``'s changes. A route added
later (``POST /v1/simulations``) is walked too, since the document lists it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.apikeys import ApiKeys
from metering.errors import InvalidInput

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
OWN, OTHER = "org-1", "org-2"


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    clock = FrozenClock(NOW - timedelta(days=2))
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("api_calls", maximum=100, period="1h", dimensions=("route",)))
        m.set_limit(Limit("tokens", maximum=1000, period="1d"))
        m.set_limit(Limit("trial", maximum=5, period="1d", enforcement="shadow"))
        for subject in (OWN, OTHER):
            m.set_entitlement(subject, "tokens", 2000)
            m.grant(subject, "tokens", 50, grant_id=f"g-{subject}")
            m.set_alert(subject, "tokens", ["80%"])
        for day in range(3):
            clock.set(NOW - timedelta(days=2 - day))
            for subject, cost in ((OWN, 10), (OTHER, 7)):
                m.consume(subject, "tokens", cost, event_id=f"t-{subject}-{day}")
                m.consume(
                    subject,
                    "api_calls",
                    cost,
                    event_id=f"a-{subject}-{day}",
                    metadata={"route": "/v1/chat"},
                )
                m.consume(subject, "trial", cost, event_id=f"s-{subject}-{day}")
        m.reserve(OTHER, "tokens", 3, event_id=f"r-{OTHER}")
        yield m


def _customer(meter: Meter) -> dict[str, str]:
    _, token = ApiKeys(meter).create("read", "portal of org-1", subject=OWN)
    return {"Authorization": f"Bearer {token}"}


PATH_VALUES = {
    "subject": OTHER,
    "limit": "tokens",
    "name": "tokens",
    "event_id": f"t-{OTHER}-0",
    "reservation_id": f"r-{OTHER}",
    "checkout_id": f"c-{OTHER}",
    "endpoint_id": "ep-1",
}
QUERY_VALUES = {"subject": OTHER, "limit": "tokens", "period": "2026-11"}
BODY = {
    "event_id": "probe-1",
    "subject": OTHER,
    "limit": "tokens",
    "cost": 1,
    "maximum": 1,
    "amount": 1,
    "at": ["50%"],
    "grant_id": "probe-g",
}


def _operations(http: httpx.Client) -> list[tuple[str, str, dict[str, Any]]]:
    schema = http.get("/openapi.json").json()
    found = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                found.append((method.upper(), path, operation))
    return found


def _call(
    http: httpx.Client, headers: dict[str, str], method: str, path: str, operation: dict[str, Any]
) -> list[httpx.Response]:
    """The operation with the other subject wherever it takes one; a route
    with an optional ``subject`` query parameter also without it (a listing)."""
    url = re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES.get(m.group(1), "x"), path)
    params = {}
    optional_subject = False
    for parameter in operation.get("parameters", []):
        name = parameter["name"]
        if parameter["in"] == "query" and name in QUERY_VALUES:
            params[name] = QUERY_VALUES[name]
            if path == "/v1/reports/shadow" and name == "limit":
                params[name] = "trial"
            optional_subject |= name == "subject" and not parameter.get("required", False)
    body = BODY if method in {"POST", "PUT", "PATCH"} else None
    answers = [http.request(method, url, params=params, json=body, headers=headers)]
    if optional_subject:
        del params["subject"]
        answers.append(http.request(method, url, params=params, json=body, headers=headers))
    return answers


def test_a_subject_key_cannot_reach_another_subject_by_any_route(
    http: httpx.Client, meter: Meter
) -> None:
    headers = _customer(meter)
    operations = _operations(http)
    assert len(operations) > 40  # the whole document, not a sample
    before = ([c.used for c in meter.counters(OTHER)], meter.grants(OTHER), meter.alerts(OTHER))
    walked = 0
    for method, path, operation in operations:
        for answer in _call(http, headers, method, path, operation):
            walked += 1
            where = f"{method} {answer.request.url}"
            assert answer.status_code in (200, 404), (where, answer.status_code, answer.text)
            assert OTHER not in answer.text, (where, answer.text[:300])
            if answer.status_code == 404:
                # The same answer as for a subject that does not exist: nothing to probe.
                assert answer.json()["type"].endswith("not-found"), where
    assert walked >= len(operations)
    # Nothing of org-2's changed, and nothing was recorded for it.
    after = ([c.used for c in meter.counters(OTHER)], meter.grants(OTHER), meter.alerts(OTHER))
    assert after == before
    assert meter.result("probe-1") is None


def test_the_same_walk_with_an_unscoped_read_key_sees_the_other_subject(
    http: httpx.Client, meter: Meter
) -> None:
    """The walk above tells a leak apart: a read key for every subject sees org-2."""
    _, token = ApiKeys(meter).create("read")
    answer = http.get(f"/v1/subjects/{OTHER}/usage", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200 and OTHER in answer.text
    report = http.get("/v1/reports/overage", headers={"Authorization": f"Bearer {token}"})
    assert report.status_code == 200 and OTHER in report.text


def test_a_subject_key_reads_its_own_subject(http: httpx.Client, meter: Meter) -> None:
    headers = _customer(meter)
    usage = http.get(f"/v1/subjects/{OWN}/usage", headers=headers)
    assert usage.status_code == 200 and usage.json()["subject"] == OWN
    report = http.get("/v1/reports/usage", params={"subject": OWN}, headers=headers)
    assert report.status_code == 200, report.text
    event = http.get(f"/v1/events/t-{OWN}-0", headers=headers)
    assert event.status_code == 200 and event.json()["charges"][0]["subject"] == OWN
    assert http.get("/v1/events/never-sent", headers=headers).status_code == 404
    # A listing without a subject is the key's own subject only.
    overage = http.get("/v1/reports/overage", params={"period": "2026-11"}, headers=headers)
    assert overage.status_code == 200
    assert {row["subject"] for row in overage.json()["rows"]} <= {OWN}
    # Another subject, existing or not, gets the same 404.
    for subject in (OTHER, "no-such-org"):
        answer = http.get(f"/v1/subjects/{subject}/usage/history?limit=tokens", headers=headers)
        assert answer.status_code == 404
        assert answer.json()["detail"] == "no such subject"


def test_only_a_read_key_can_be_limited_to_a_subject(meter: Meter) -> None:
    with pytest.raises(InvalidInput, match="only a read key"):
        ApiKeys(meter).create("admin", subject=OWN)
    with pytest.raises(InvalidInput):
        ApiKeys(meter).create("read", subject="")
    assert ApiKeys(meter).list() == []


def test_a_subject_key_lists_its_own_reservations_checkouts_and_grants(
    http: httpx.Client, meter: Meter
) -> None:
    meter.set_limit(Limit("seats", maximum=5, algorithm="concurrent"))
    for subject in (OWN, OTHER):
        meter.reserve(subject, "tokens", 2, event_id=f"r2-{subject}")
        meter.checkout(subject, "seats", checkout_id=f"c-{subject}")
    both = [(OWN, "tokens", 1), (OTHER, "tokens", 1)]
    meter.reserve(charges=both, event_id="r-both")  # touches org-2: never shown to org-1
    headers = _customer(meter)
    expected = {
        "/v1/reservations": ("reservations", "id", [f"r2-{OWN}"]),
        "/v1/checkouts": ("checkouts", "id", [f"c-{OWN}"]),
        "/v1/grants": ("grants", "grant_id", [f"g-{OWN}"]),
    }
    for path, (key, field, ids) in expected.items():
        for params in ({}, {"subject": OWN}):
            answer = http.get(path, params=params, headers=headers)
            assert answer.status_code == 200, (path, answer.text)
            assert OTHER not in answer.text, (path, answer.text)
            assert [item[field] for item in answer.json()[key]] == ids, path
        other = http.get(path, params={"subject": OTHER}, headers=headers)
        assert other.status_code == 404 and other.json()["type"].endswith("not-found"), path
