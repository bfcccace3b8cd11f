"""``GET /v1/audit``: the last audit's findings, to an admin's key only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import update

from metering import FrozenClock, Limit, Meter
from metering.apikeys import ApiKeys
from metering.domain.audit import INVARIANTS
from metering.storage.tables import counters
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=10, period="1h", window="calendar"))
        yield m


def test_the_last_run_is_shown(http: httpx.Client, meter: Meter) -> None:
    never = http.get("/v1/audit").json()
    assert (never["ran_at"], never["violations"]) == (None, [])
    assert never["counts"] == dict.fromkeys(INVARIANTS, 0)
    meter.consume("org-1", "api_calls", 3)
    with meter.database.engine.begin() as connection:
        connection.execute(update(counters).values(used=4))
    run_audit(meter)
    answer = http.get("/v1/audit")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["ran_at"], body["full"], body["windows"]) == ("2026-11-22T09:30:00+00:00", True, 1)
    assert body["counts"]["counter_ledger"] == 1
    assert body["violations"] == [
        {
            "invariant": "counter_ledger",
            "subject": "org-1",
            "limit": "api_calls",
            "window_start": "2026-11-22T09:00:00+00:00",
            "item": None,
            "expected": "used 3",
            "found": "used 4",
        }
    ]


@pytest.mark.parametrize("scope", ["ingest", "read"])
def test_only_an_admin_key_reads_it(http: httpx.Client, meter: Meter, scope: str) -> None:
    _key, admin = ApiKeys(meter).create("admin")
    _key, other = ApiKeys(meter).create(scope)
    assert http.get("/v1/audit").status_code == 401  # a key exists: one is asked for
    refused = http.get("/v1/audit", headers={"Authorization": f"Bearer {other}"})
    assert refused.status_code == 403
    assert refused.headers["content-type"] == "application/problem+json"
    allowed = http.get("/v1/audit", headers={"Authorization": f"Bearer {admin}"})
    assert allowed.status_code == 200


def test_the_route_is_in_the_openapi_document(http: httpx.Client) -> None:
    operation = http.get("/openapi.json").json()["paths"]["/v1/audit"]["get"]
    assert operation["summary"] == "The last audit"
    assert {"200", "401", "403"} <= set(operation["responses"])
