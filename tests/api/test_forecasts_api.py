"""``exhausts_at`` over HTTP, on the usage page and in the OpenAPI document:
at a frozen instant, the rate computed by hand (docs/forecasts.md)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.usage.portal import portal_view, render_page

NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOON)) as m:
        m.set_limits(
            [
                Limit("calls", maximum=1_000, period="1d", window="calendar"),
                Limit("burst", maximum=10, period="1m", algorithm="token_bucket"),
            ]
        )
        yield m


def test_usage_answers_when_the_allowance_runs_out(http: httpx.Client, meter: Meter) -> None:
    meter.consume("org-1", "calls", 360)  # 360 / 3,600 s: 0.1 a second, 640 left
    meter.consume("org-1", "burst", 1)
    found = {u["limit"]: u for u in http.get("/v1/subjects/org-1/usage").json()["limits"]}
    expected = NOON + timedelta(seconds=6_400)
    assert datetime.fromisoformat(found["calls"]["exhausts_at"]) == expected
    assert found["burst"]["exhausts_at"] is None  # a bucket has no reset to run out before
    [panel] = [p for p in portal_view(meter.database, "org-1").limits if p.name == "calls"]
    assert panel.exhausts_at == expected
    assert f'data-exhausts-at="{expected.isoformat()}"' in render_page(
        portal_view(meter.database, "org-1")
    )


def test_a_slow_rate_does_not_run_out_before_the_reset(http: httpx.Client, meter: Meter) -> None:
    meter.consume("org-1", "calls", 36)  # 0.01 a second: 96,400 s, past midnight
    [usage] = http.get("/v1/subjects/org-1/usage").json()["limits"]
    assert usage["exhausts_at"] is None


def test_the_schema_describes_it(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    field = schema["components"]["schemas"]["LimitUsageOut"]["properties"]["exhausts_at"]
    assert "recent rate" in field["description"]


def test_a_forecast_lead_is_set_read_and_described(http: httpx.Client, meter: Meter) -> None:
    body = {"maximum": 1_000, "period": "1d", "window": "calendar", "forecast_lead": "24h"}
    stored = http.put("/v1/limits/daily", json=body)
    assert stored.status_code == 200, stored.text
    assert stored.json()["forecast_lead"] == "1d"
    assert meter.get_limit("daily").forecast_lead_seconds == 86_400
    assert "forecast_lead" not in http.get("/v1/limits/calls").json()
    document = http.get("/openapi.json").json()
    put = document["paths"]["/v1/limits/{name}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert "limit.forecast" in body["properties"]["forecast_lead"]["description"]
    assert "forecast_lead" in document["components"]["schemas"]["LimitOut"]["properties"]


@pytest.mark.parametrize(
    "fields",
    [
        {"forecast_lead": "1mo"},
        {"forecast_lead": "0s"},
        {"forecast_lead": "1h", "algorithm": "token_bucket", "window": "first_use"},
        {"forecast_lead": "1h", "aggregation": "max"},
    ],
)
def test_a_bad_lead_is_400_and_stores_nothing(
    http: httpx.Client, meter: Meter, fields: dict[str, object]
) -> None:
    body = {"maximum": 1_000, "period": "1d", "window": "calendar", **fields}
    answer = http.put("/v1/limits/daily", json=body)
    assert answer.status_code == 400, answer.text
    assert "forecast_lead" in answer.text
    assert "daily" not in {limit.name for limit in meter.list_limits()}
