"""``POST /v1/imports`` (in process): an admin key imports a streamed body of
JSON Lines or CSV; the flags and the route itself are refused without one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
from metering.settings import Settings

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
NDJSON = {"content-type": "application/x-ndjson"}
InProcess = Callable[[Any], httpx.Client]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=3, period="1d", window="calendar"))
        yield m


@pytest.fixture
def tokens(meter: Meter) -> dict[str, str]:
    return {s: ApiKeys(meter).create(s, f"{s} key")[1] for s in ("ingest", "read", "admin")}


@pytest.fixture
def http(in_process: InProcess, meter: Meter, tmp_path: Path) -> httpx.Client:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    return in_process(create_api(settings, meter=meter))


def auth(token: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **headers}


def line(event_id: str, at: datetime = NOW, cost: int = 1) -> bytes:
    item = {"event_id": event_id, "subject": "örg-1", "limit": "calls", "cost": cost}
    text = json.dumps({**item, "occurred_at": at.isoformat()}, ensure_ascii=False)
    return (text + "\n").encode()


def test_a_streamed_body_is_imported_once(http: httpx.Client, tokens: dict[str, str]) -> None:
    body = b"".join(line(f"e{i}") for i in range(4)) + b"{bad\n"

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 7):  # lines cut across chunks, a character too
            yield body[start : start + 7]

    answer = http.post("/v1/imports", content=chunks(), headers=auth(tokens["admin"], **NDJSON))
    assert answer.status_code == 200, answer.text
    summary = answer.json()
    assert (summary["applied"], summary["denied"], summary["bad"]) == (3, 1, 1)
    assert summary["bad_lines"][0]["line"] == 5
    again = http.post("/v1/imports", content=body, headers=auth(tokens["admin"], **NDJSON)).json()
    assert (again["applied"], again["duplicates"]) == (0, 4)


def test_csv_with_metadata_and_the_flags(
    http: httpx.Client, tokens: dict[str, str], meter: Meter
) -> None:
    old = (NOW - timedelta(days=30)).isoformat()
    body = f"event_id,subject,limit,cost,occurred_at,region\nc1,org-2,calls,5,{old},eu\n"
    answer = http.post(
        "/v1/imports",
        content=body,
        params={"no_enforce": "true", "allow_late": "true"},
        headers=auth(tokens["admin"], **{"content-type": "text/csv; charset=utf-8"}),
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["applied"] == 1
    result = http.get("/v1/events/c1", headers=auth(tokens["read"])).json()
    assert result["outcome"] == "overage"
    assert result["reason"] == "imported: not enforced, lateness not checked"
    found = meter.result("c1")
    assert found is not None and found.metadata == {"region": "eu"}


@pytest.mark.parametrize("scope", ["ingest", "read"])
@pytest.mark.parametrize("params", [{}, {"no_enforce": "true", "allow_late": "true"}])
def test_refused_without_an_admin_key(
    http: httpx.Client, tokens: dict[str, str], meter: Meter, scope: str, params: dict[str, str]
) -> None:
    answer = http.post(
        "/v1/imports", content=line("x1"), params=params, headers=auth(tokens[scope], **NDJSON)
    )
    assert answer.status_code == 403, answer.text
    assert meter.result("x1") is None


def test_strict_and_the_content_type(http: httpx.Client, tokens: dict[str, str]) -> None:
    admin = tokens["admin"]
    strict = http.post(
        "/v1/imports",
        content=line("s1") + b"[]\n",
        params={"strict": "true"},
        headers=auth(admin, **NDJSON),
    )
    assert strict.status_code == 400 and "line 2" in strict.json()["detail"]
    wrong = http.post("/v1/imports", content=line("s1"), headers=auth(admin))
    assert wrong.status_code == 415
    assert "application/x-ndjson" in wrong.json()["detail"]
    schema = http.get("/openapi.json").json()
    assert "/v1/imports" in schema["paths"]


def test_the_streamed_body_is_not_bounded_like_others(
    in_process: InProcess, meter: Meter, tmp_path: Path
) -> None:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/b.db", api_max_body_bytes=300)
    http = in_process(create_api(settings, meter=meter))  # no key yet: the API is open
    body = b"".join(line(f"big{i}") for i in range(3))
    assert len(body) > 300
    answer = http.post("/v1/imports", content=body, headers=NDJSON)
    assert answer.status_code == 200, answer.text
    assert answer.json()["applied"] == 3
    bounded = http.post("/v1/events", content=body, headers={"content-type": "application/json"})
    assert bounded.status_code == 413
