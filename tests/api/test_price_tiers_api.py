"""Tiered prices over HTTP, in process, on both databases: ``PUT
/v1/prices/{limit}`` with a ``model``, ``tiers``, ``package`` and
``flat_fee``, as listed and in the OpenAPI document; a bad one is a 400
naming its field and stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=100_000, period="1mo", window="calendar"))
        yield m


def test_a_graduated_price_with_a_flat_fee_over_http(http: httpx.Client, meter: Meter) -> None:
    spend = {"max_amount": "100", "currency": "USD", "period": "1mo", "window": "calendar"}
    assert http.put("/v1/limits/spend", json=spend).status_code == 200
    body = {
        "currency": "USD",
        "model": "graduated",
        "tiers": [{"up_to": 1000, "price": "0.01"}, {"up_to": None, "price": "0.005"}],
        "flat_fee": "20",
    }
    answer = http.put("/v1/prices/calls", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "limit": "calls",
        "currency": "USD",
        "per_unit": None,
        "per_unit_micro_minor": None,
        "effective_from": NOW.isoformat(),
        "model": "graduated",
        "tiers": [{"up_to": 1000, "price": "0.01"}, {"up_to": None, "price": "0.005"}],
        "flat_fee": "20.00",
    }
    assert http.get("/v1/prices").json()["prices"] == [answer.json()]
    event = {"subject": "org", "limit": "calls", "cost": 1200}
    checked = http.post("/v1/check", json=event)
    assert checked.status_code == 200, checked.text
    # 20.00 + 1,000 at 0.01 + 200 at 0.005
    assert checked.json()["charges"][0]["amount"] == "31.00"
    assert meter.consume("org", "calls", 1200).allowed
    report = http.get("/v1/reports/spend", params={"period": "2026-11"}).json()
    assert report["rows"][0]["total"] == "31.00"


def test_a_package_price_over_http(http: httpx.Client, meter: Meter) -> None:
    body = {"currency": "USD", "model": "package", "package": 100, "per_package": "1.00"}
    answer = http.put("/v1/prices/calls", json=body)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["package"], answer.json()["per_package"]) == (100, "1.00")


def test_the_openapi_document_has_the_fields(http: httpx.Client, meter: Meter) -> None:
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    fields = schemas["PriceOut"]["properties"]
    assert {"model", "tiers", "package", "per_package", "flat_fee"} <= set(fields)
    assert set(schemas["TierOut"]["properties"]) == {"up_to", "price"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "graduated", "tiers": [{"up_to": 10, "price": "1"}]}, "tiers"),
        (
            {
                "model": "volume",
                "tiers": [{"up_to": 10, "price": "1"}, {"up_to": 5, "price": "1"}],
            },
            "tiers",
        ),
        ({"model": "graduated", "tiers": [{"up_to": None, "price": -1}]}, "tiers"),
        ({"model": "graduated", "tiers": [{"up_to": 0, "price": "1"}, {"up_to": None}]}, "tiers"),
        ({"model": "package", "package": 0, "per_package": "1"}, "package"),
        ({"model": "package", "package": "10", "per_package": "1"}, "package"),
        ({"model": "package", "package": 10}, "per_package"),
        ({"model": "flat"}, "model"),
        ({"per_unit": "0.01", "flat_fee": 20}, "flat_fee"),
        ({}, "per_unit"),
    ],
)
def test_bad_tiers_are_400s_that_change_nothing(
    http: httpx.Client, meter: Meter, body: dict[str, Any], field: str
) -> None:
    answer = http.put("/v1/prices/calls", json={"currency": "USD", **body})
    assert answer.status_code == 400, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == [field], answer.text
    assert meter.prices() == []
