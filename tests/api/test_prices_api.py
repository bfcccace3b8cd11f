"""Prices and the spend report over HTTP, in process, on both databases.

``PUT``/``DELETE``/``GET /v1/prices`` and ``GET /v1/reports/spend``; spend
limits through ``PUT /v1/limits/{name}``. A bad value is a 400 naming its
field and changes nothing; changing a price takes the admin scope.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
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
Serve = Callable[[Any], str]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=1000, period="1mo", window="calendar"))
        yield m


def bad(answer: httpx.Response, status: int, field: str | None = None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    if field is not None:
        assert [e["field"] for e in answer.json()["errors"]] == [field], answer.text


def test_a_charge_costing_more_than_the_largest_amount_is_a_400(
    http: httpx.Client, meter: Meter
) -> None:
    meter.set_limit(Limit("big", maximum=10**12, period="1d"))
    meter.set_price("big", "10000000", "USD")
    event = {"subject": "org-x", "limit": "big", "cost": 10**12}
    for path, params in [("/v1/events", {"wait": "decision"}), ("/v1/check", {})]:
        answer = http.post(path, json=event, params=params)
        bad(answer, 400)
        [error] = answer.json()["errors"]
        assert error["field"] == "cost" and "the most one charge" in error["message"]
    assert meter.counters() == [] and meter.count_results() == 0


def test_a_priced_limit_charges_a_spend_cap_over_http(http: httpx.Client, meter: Meter) -> None:
    spend = {"max_amount": "0.10", "currency": "USD", "period": "1mo", "window": "calendar"}
    made = http.put("/v1/limits/spend", json=spend)
    assert made.status_code == 200, made.text
    assert (made.json()["maximum"], made.json()["max_amount"]) == (10, "0.10")
    price = http.put("/v1/prices/calls", json={"per_unit": "0.002", "currency": "usd"})
    assert price.status_code == 200, price.text
    assert price.json() == {
        "limit": "calls",
        "currency": "USD",
        "per_unit": "0.002",
        "per_unit_micro_minor": 200_000,
        "effective_from": NOW.isoformat(),
        "model": "per_unit",
    }
    assert http.get("/v1/prices").json()["prices"] == [price.json()]
    assert [meter.consume("org-1", "calls", 20).allowed for _ in range(2)] == [True, True]
    checked = http.post("/v1/check", json={"subject": "org-1", "limit": "calls", "cost": 20})
    assert (checked.json()["outcome"], checked.json()["denied_by"]) == ("denied", ["spend"])
    [priced, spent] = checked.json()["charges"]
    assert (priced["limit"], spent["limit"], spent["used"], spent["maximum"]) == (
        "calls",
        "spend",
        8,
        10,
    )
    report = http.get("/v1/reports/spend", params={"period": "2026-11"})
    assert report.status_code == 200
    assert report.json() == {
        "report": "spend",
        "period": "2026-11",
        "rows": [
            {
                "subject": "org-1",
                "currency": "USD",
                "amounts": {"calls": "0.08"},
                "total": "0.08",
                "spend_limit": "spend",
                "cap": "0.10",
                "time_zone": None,
                "local_window": None,
            }
        ],
    }
    text = http.get("/v1/reports/spend", params={"period": "2026-11", "format": "csv"}).text
    assert list(csv.reader(io.StringIO(text))) == [
        [
            "subject",
            "currency",
            "total",
            "spend_limit",
            "cap",
            "time_zone",
            "local_window",
            "amount:calls",
        ],
        ["org-1", "USD", "0.08", "spend", "0.10", "", "", "0.08"],
    ]
    ended = http.delete("/v1/prices/calls", params={"currency": "USD"})
    assert ended.json()["per_unit"] is None
    assert meter.consume("org-1", "calls", 20).allowed  # no price: nothing spent


def test_bad_prices_and_spend_limits_are_400s_that_change_nothing(
    http: httpx.Client, meter: Meter
) -> None:
    meter.set_limit(Limit("spend", maximum=100, period="1mo", currency="USD"))
    before = (meter.prices(), meter.list_limits())
    for body, field in [
        ({"per_unit": "0.002", "currency": "XXX"}, "currency"),
        ({"per_unit": "0.000000001", "currency": "USD"}, "per_unit"),
        ({"per_unit": "0.0000001", "currency": "JPY"}, "per_unit"),
        ({"per_unit": "-1", "currency": "USD"}, "per_unit"),
        ({"per_unit": 0.002, "currency": "USD"}, "per_unit"),
        ({"currency": "USD"}, "per_unit"),
        ({"per_unit": "1"}, "currency"),
        ({"per_unit": "1", "currency": "USD", "effective_from": "soon"}, "effective_from"),
    ]:
        bad(http.put("/v1/prices/calls", json=body), 400, field)
    bad(http.put("/v1/prices/spend", json={"per_unit": "1", "currency": "USD"}), 400, "limit")
    bad(http.put("/v1/prices/nope", json={"per_unit": "1", "currency": "USD"}), 422)
    for body, field in [
        ({"max_amount": "10", "period": "1mo"}, "currency"),
        ({"max_amount": "10.001", "currency": "USD", "period": "1mo"}, "max_amount"),
        ({"max_amount": "10", "currency": "ABC", "period": "1mo"}, "currency"),
        ({"period": "1mo"}, "maximum"),
    ]:
        bad(http.put("/v1/limits/spend", json=body), 400, field)
    bad(http.get("/v1/reports/spend", params={"period": "2026-13"}), 400)
    assert (meter.prices(), meter.list_limits()) == before


def test_prices_take_admin_and_the_report_read(http: httpx.Client, meter: Meter) -> None:
    keys = ApiKeys(meter)
    tokens = {scope: keys.create(scope, scope)[1] for scope in ("ingest", "read", "admin")}
    body = {"per_unit": "0.5", "currency": "EUR"}
    for method, path, needs in [
        ("PUT", "/v1/prices/calls", "admin"),
        ("DELETE", "/v1/prices/calls?currency=EUR", "admin"),
        ("GET", "/v1/prices", "read"),
        ("GET", "/v1/reports/spend?period=2026-11", "read"),
    ]:
        assert http.request(method, path, json=body).status_code == 401
        for holder, token in tokens.items():
            headers = {"authorization": f"Bearer {token}"}
            status = http.request(method, path, json=body, headers=headers).status_code
            allowed = holder == needs or holder == "admin"
            assert (status not in (401, 403)) == allowed, (method, path, holder, status)


CHECKS = (
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


def test_schemathesis_no_5xx_and_every_answer_conforms(
    serve_api: Serve, sqlite_url: str, tmp_path: Path
) -> None:
    """Generated requests, valid and invalid by the schema, for the prices
    routes and the spend report (on SQLite: the rules are the library's)."""
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=1000, period="1mo", window="calendar"))
        meter.set_price("calls", "0.01", "USD")
        meter.consume("org-1", "calls", 3)
        settings_ = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
        with httpx.Client(base_url=serve_api(create_api(settings_, meter=meter))) as http:
            api_schema = schemathesis.openapi.from_url(f"{http.base_url}/openapi.json")
            seen = 0
            for result in api_schema.get_all_operations():
                operation = result.ok()
                if not operation.path.startswith(("/v1/prices", "/v1/reports/spend")):
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
            assert seen == 4
