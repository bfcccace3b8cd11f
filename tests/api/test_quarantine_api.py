"""The runaway breaker over HTTP: a limit's ``breaker``, ``breaker_floor`` and
``quarantine_max`` in ``PUT /v1/limits`` (a bad one a 400 naming it, nothing
stored); ``GET /v1/quarantines``; ``POST /v1/quarantines/{limit}/{subject}/release``;
the webhook's signed release link (a page, then a POST that releases once;
a forged link a 401 page or problem that changes nothing); all in the
OpenAPI document. In process, on SQLite and PostgreSQL."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import urljoin

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.webhooks import Webhooks

START = datetime(2026, 11, 2, tzinfo=UTC)
API = Limit(
    "api",
    maximum=100_000,
    period="1d",
    breaker="10x",
    breaker_floor=0.1,
    quarantine_max=1000,
)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(START)) as m:
        m.set_limit(API)
        yield m


def _trip(meter: Meter, subject: str = "org/1") -> str:
    """A minute of 60 a second trips the breaker: the release path of its notice."""
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    for _ in range(62):
        meter.consume(subject, "api", 60)
        clock.advance(seconds=1)
    [*_, (_, _, payload)] = Webhooks(meter).messages("limit.quarantined")
    return str(json.loads(payload)["data"]["release_path"])


def test_a_breaker_is_set_read_and_refused_when_bad(http: httpx.Client, meter: Meter) -> None:
    body = {"maximum": 500, "period": "1h", "breaker": "5x", "breaker_floor": 0.5}
    put = http.put("/v1/limits/calls", json=body)
    assert put.status_code == 200, put.text
    got = http.get("/v1/limits/calls").json()
    assert (got["breaker"], got["breaker_floor"], got["quarantine_max"]) == ("5x", 0.5, None)
    for field, value in (("breaker", "0x"), ("breaker", "abc"), ("breaker_floor", 0)):
        bad = http.put("/v1/limits/other", json={**body, field: value})
        assert bad.status_code == 400, bad.text
        assert bad.json()["errors"][0]["field"] == field
    assert http.get("/v1/limits/other").status_code == 404  # nothing stored
    schema = http.get("/openapi.json").json()
    put = schema["paths"]["/v1/limits/{name}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert {"breaker", "breaker_floor", "quarantine_max"} <= set(body["properties"])
    assert "/v1/quarantines/{limit}/{subject}/release" in schema["paths"]
    assert "/quarantine/release" in schema["paths"]


def test_a_quarantine_is_listed_and_released_by_an_admin(http: httpx.Client, meter: Meter) -> None:
    _trip(meter)
    listed = http.get("/v1/quarantines").json()["quarantines"]
    assert [(q["limit"], q["subject"]) for q in listed] == [("api", "org/1")]
    released = http.post("/v1/quarantines/api/org/1/release")
    assert released.status_code == 200, released.text
    assert released.json()["subject"] == "org/1"
    assert http.get("/v1/quarantines").json() == {"quarantines": []}
    again = http.post("/v1/quarantines/api/org/1/release")
    assert again.status_code == 404 and "not quarantined" in again.json()["detail"]
    assert meter.consume("org/1", "api", 60).allowed


def test_the_signed_link_releases_once_and_a_forged_one_changes_nothing(
    http: httpx.Client, meter: Meter
) -> None:
    path = _trip(meter)
    forged = path[:-3] + ("AAA" if not path.endswith("AAA") else "BBB")
    page = http.get(forged, headers={"Accept": "text/html"})
    assert page.status_code == 401 and "text/html" in page.headers["content-type"]
    refused = http.post(forged)
    assert refused.status_code == 401
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert [q.subject for q in meter.quarantines()] == ["org/1"]  # nothing changed
    shown = http.get(path, headers={"Accept": "text/html"})
    assert shown.status_code == 200 and 'method="post"' in shown.text
    # The form posts to the page's own path, under a proxy's prefix too.
    [action] = re.findall(r'action="([^"]+)"', shown.text)
    public = "https://example.com/metering" + path
    assert urljoin(public, html.unescape(action)) == public
    assert [q.subject for q in meter.quarantines()] == ["org/1"]  # opening it releases nothing
    done = http.post(path, headers={"Accept": "text/html"})
    assert done.status_code == 200 and "released" in done.text
    assert meter.quarantines() == []
    assert http.post(path).status_code == 401  # once
