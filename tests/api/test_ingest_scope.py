"""An ingest-only key learns outcomes, not figures (issue 19, item 8).

A denied ``?wait=decision`` probe (cost 10^12) used to answer an ingest key
the subject's ``used``, ``remaining`` and ``maximum``; ``POST
/v1/reservations`` too, and a repeated id's stored result in the 202. Now an
ingest-only key gets the outcome (allowed, outcome, denied_by, the event id,
duplicate, the window's times) and a key that may read gets the figures as
well. Real keys, the app under uvicorn on loopback, SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import http_client

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.api.ratelimit import RATE_LIMIT
from metering.apikeys import ApiKeys
from metering.settings import Settings
from metering.webhooks import Webhooks

Serve = Callable[[Any], str]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
FIGURES = {"used", "remaining", "maximum"}
CHARGE_FIGURES = {"used", "remaining", "maximum", "overage", "grants"}
PROBE = {"subject": "org-victim", "limit": "api_calls", "cost": 10**12}


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=5, period="1h", window="calendar"))
        m.consume("org-victim", "api_calls", cost=3, event_id="earlier")
        yield m


@pytest.fixture
def clients(serve_api: Serve, meter: Meter, tmp_path: Path) -> Iterator[dict[str, httpx.Client]]:
    """An httpx client per scope, each with a real key of it."""
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    base = serve_api(create_api(settings, meter=meter))
    keys = ApiKeys(meter)
    made: dict[str, httpx.Client] = {}
    for scope in ("ingest", "admin"):
        _key, token = keys.create(scope, name=scope)
        made[scope] = http_client(
            base_url=base, headers={"authorization": f"Bearer {token}"}, timeout=30
        )
    yield made
    for client in made.values():
        client.close()


def _no_figures(decision: dict[str, Any]) -> None:
    assert not FIGURES & decision.keys(), decision
    for charge in decision["charges"]:
        assert not CHARGE_FIGURES & charge.keys(), charge


def test_a_denied_probe_tells_an_ingest_key_the_outcome_only(
    clients: dict[str, httpx.Client],
) -> None:
    answer = clients["ingest"].post(
        "/v1/events", params={"wait": "decision"}, json={**PROBE, "event_id": "probe-1"}
    )
    assert answer.status_code == 200, answer.text
    [result] = answer.json()["results"]
    _no_figures(result)
    assert result["outcome"] == "denied" and result["allowed"] is False
    assert result["denied_by"] == ["api_calls"] and result["event_id"] == "probe-1"
    assert result["duplicate"] is False and result["resets_at"] is not None
    assert result["charges"][0]["outcome"] == "denied"
    # The API's own per-key rate headers are about this key's requests, not the subject.
    assert answer.headers["ratelimit"].startswith(f'"{RATE_LIMIT}";')
    # A key that may read gets the figures.
    read = clients["admin"].post(
        "/v1/events", params={"wait": "decision"}, json={**PROBE, "event_id": "probe-2"}
    )
    [full] = read.json()["results"]
    assert (full["used"], full["remaining"], full["maximum"]) == (3, 2, 5)
    assert full["charges"][0]["used"] == 3 and full["charges"][0]["overage"] == 0


def test_a_repeated_id_answers_an_ingest_key_without_figures(
    clients: dict[str, httpx.Client],
) -> None:
    earlier = {"subject": "org-victim", "limit": "api_calls", "event_id": "earlier", "cost": 3}
    queued = clients["ingest"].post("/v1/events", json=earlier)
    assert queued.status_code == 202, queued.text
    [duplicate] = queued.json()["duplicates"]
    assert duplicate["duplicate"] is True and duplicate["outcome"] == "allowed"
    _no_figures(duplicate)
    again = clients["ingest"].post("/v1/events", params={"wait": "decision"}, json=earlier)
    [result] = again.json()["results"]
    assert result["duplicate"] is True
    _no_figures(result)


def test_a_reservation_tells_an_ingest_key_the_outcome_only(
    clients: dict[str, httpx.Client],
) -> None:
    denied = clients["ingest"].post("/v1/reservations", json={**PROBE, "event_id": "r-1"})
    assert denied.status_code == 200, denied.text
    body = denied.json()
    assert body["state"] == "denied" and body["allowed"] is False
    _no_figures(body["decision"])
    assert body["decision"]["denied_by"] == ["api_calls"]
    held = (
        clients["ingest"]
        .post("/v1/reservations", json={**PROBE, "cost": 1, "event_id": "r-2"})
        .json()
    )
    assert held["state"] == "held"
    _no_figures(held["decision"])
    full = clients["admin"].post("/v1/reservations", json={**PROBE, "event_id": "r-3"}).json()
    assert full["decision"]["used"] == 4 and full["decision"]["maximum"] == 5


def _victim(meter: Meter) -> list[tuple[int, int, int]]:
    return [(c.used, c.denied_count, c.denied_cost) for c in meter.counters("org-victim")]


def test_a_denied_probe_from_an_ingest_key_records_nothing_and_notifies_nobody(
    clients: dict[str, httpx.Client], meter: Meter
) -> None:
    hooks = Webhooks(meter)
    hooks.add("https://example.com/hooks")
    before = _victim(meter)
    ingest = clients["ingest"]
    probe = ingest.post(
        "/v1/events", params={"wait": "decision"}, json={**PROBE, "event_id": "p-1"}
    )
    assert probe.status_code == 200, probe.text
    [result] = probe.json()["results"]
    assert (result["event_id"], result["outcome"], result["duplicate"]) == ("p-1", "denied", False)
    batch = [{**PROBE, "event_id": "p-2"}, {**PROBE, "cost": 1, "event_id": "fits-1"}]
    answers = ingest.post("/v1/events", params={"wait": "decision"}, json=batch).json()["results"]
    assert [a["outcome"] for a in answers] == ["denied", "allowed"]
    reserved = ingest.post("/v1/reservations", json={**PROBE, "event_id": "p-3"})
    assert reserved.status_code == 200, reserved.text
    assert (reserved.json()["state"], reserved.json()["id"]) == ("denied", "p-3")
    _no_figures(reserved.json()["decision"])
    # Nothing of the probes was stored, counted or announced; what fit was charged.
    assert [meter.result(i) for i in ("p-1", "p-2", "p-3")] == [None, None, None]
    assert meter.reservation("p-3") is None
    assert _victim(meter) == [(used + 1, count, cost) for used, count, cost in before]
    assert hooks.messages() == []
    # A key that may read still records a denial, as the worker does.
    clients["admin"].post(
        "/v1/events", params={"wait": "decision"}, json={**PROBE, "event_id": "p-4"}
    )
    assert meter.result("p-4") is not None and meter.result("p-4").outcome == "denied"
    assert [t for _, t, _ in hooks.messages()] == ["limit.denied"]


def test_a_token_bucket_retry_at_is_withheld_from_an_ingest_key(
    clients: dict[str, httpx.Client], meter: Meter
) -> None:
    meter.set_limit(Limit("burst", maximum=5, period="1m", algorithm="token_bucket"))
    meter.consume("org-victim", "burst", 4, event_id="burst-0")
    drained = {"subject": "org-victim", "limit": "burst", "cost": 3}
    ingest = clients["ingest"].post(
        "/v1/events", params={"wait": "decision"}, json={**drained, "event_id": "b-1"}
    )
    [result] = ingest.json()["results"]
    assert result["outcome"] == "denied"
    assert result["retry_at"] is None and result["charges"][0]["retry_at"] is None
    held = clients["ingest"].post("/v1/reservations", json={**drained, "event_id": "b-2"}).json()
    assert held["state"] == "denied" and held["decision"]["retry_at"] is None
    # A fixed window's retry_at is its end, which says nothing of the usage: it stays.
    fixed = clients["ingest"].post(
        "/v1/events", params={"wait": "decision"}, json={**PROBE, "cost": 3, "event_id": "b-3"}
    )
    assert fixed.json()["results"][0]["retry_at"] == "2026-11-22T10:00:00+00:00"
    # A key that may read is told when the bucket has room again.
    full = clients["admin"].post(
        "/v1/events", params={"wait": "decision"}, json={**drained, "event_id": "b-4"}
    )
    [told] = full.json()["results"]
    assert told["retry_at"] is not None and told["charges"][0]["retry_at"] == told["retry_at"]
