"""Interfaces that disagreed (issue 19, item 13, the API's part).

``GET /v1/reports/overage?format=csv`` used to ignore ``format`` (JSON came
back): now ``format=csv`` answers CSV, ``json`` (or none) JSON, anything else
400. A path whose percent-escapes are not UTF-8 (``%FF``) used to become
U+FFFD and be served; now it is a 400 problem, while a real U+FFFD
(``%EF%BF%BD``) is still a subject like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.settings import Settings

InProcess = Callable[[Any], httpx.Client]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=5, period="1h", window="calendar"))
        m.consume("org-1", "api_calls", cost=2)
        m.consume("\ufffd", "api_calls", cost=1)
        yield m


@pytest.fixture
def http(in_process: InProcess, meter: Meter, tmp_path: Path) -> httpx.Client:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    return in_process(create_api(settings, meter=meter))


@pytest.mark.parametrize("report", ["overage", "usage"])
def test_format_picks_csv_or_json_and_refuses_anything_else(
    http: httpx.Client, report: str
) -> None:
    params = {"usage": {"subject": "org-1"}}.get(report, {})
    as_csv = http.get(f"/v1/reports/{report}", params={**params, "format": "csv"})
    assert as_csv.status_code == 200, as_csv.text
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    assert as_csv.text.splitlines()[0].startswith("subject,")
    # format wins over Accept.
    as_json = http.get(
        f"/v1/reports/{report}",
        params={**params, "format": "json"},
        headers={"accept": "text/csv"},
    )
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json()["report"] == report
    assert http.get(f"/v1/reports/{report}", params=params).json()["report"] == report
    for bad in ("xml", "CSV ", ""):
        refused = http.get(f"/v1/reports/{report}", params={**params, "format": bad})
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.headers["content-type"] == PROBLEM
        assert refused.json()["errors"][0]["field"] == "format"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/subjects/%FF/usage",
        "/v1/subjects/org%C3/usage",
        "/v1/events/%FF",
        "/v1/limits/%80",
        "/v1/reservations/a%FFb",
        "/v1/reports/usage?subject=%FF",
    ],
)
def test_a_path_that_is_not_utf8_is_400(http: httpx.Client, path: str) -> None:
    answer = http.get(path)
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == PROBLEM
    assert "UTF-8" in answer.json()["detail"]


def test_a_real_replacement_character_is_still_a_subject(http: httpx.Client) -> None:
    answer = http.get("/v1/subjects/%EF%BF%BD/usage")
    assert answer.status_code == 200, answer.text
    assert answer.json()["subject"] == "\ufffd"
    assert answer.json()["limits"][0]["used"] == 1
