"""Prices and the spend report over HTTP, in process, on both databases.

``PUT``/``DELETE``/``GET /v1/prices`` and ``GET /v1/reports/spend``; spend
limits through ``PUT /v1/limits/{name}``. A bad value is a 400 naming its
field and changes nothing; changing a price takes the admin scope.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
from metering.settings import Settings

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=1000, period="1mo", window="calendar"))
        yield m


@pytest.fixture
def http(in_process: object, meter: Meter, tmp_path: Path) -> httpx.Client:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    return in_process(create_api(settings, meter=meter))  # type: ignore[operator,no-any-return]


def bad(answer: httpx.Response, status: int, field: str | None = None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    if field is not None:
        assert [e["field"] for e in answer.json()["errors"]] == [field], answer.text


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
            }
        ],
    }
    text = http.get("/v1/reports/spend", params={"period": "2026-11", "format": "csv"}).text
    assert list(csv.reader(io.StringIO(text))) == [
        ["subject", "currency", "total", "spend_limit", "cap", "amount:calls"],
        ["org-1", "USD", "0.08", "spend", "0.10", "0.08"],
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
