"""``GET /v1/subjects/{subject}/usage/history`` (`metering/api/history.py`) on
both databases, called in process with a customer's key: per day from the
counters, per hour from the rollups of a limit with dimensions, each bucket
with the maximum in force; bad input is a 400 naming its field, an unknown
limit a 422; a key not limited to a subject reads any subject's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.apikeys import ApiKeys

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


def _customer(meter: Meter) -> dict[str, str]:
    _, token = ApiKeys(meter).create("read", "portal of org-1", subject=OWN)
    return {"Authorization": f"Bearer {token}"}


def test_usage_history_by_day_from_counters_with_the_maximum_in_force(
    http: httpx.Client, meter: Meter
) -> None:
    meter.set_entitlement(OWN, "tokens", 3000, effective_from=NOW - timedelta(days=1))
    headers = _customer(meter)
    answer = http.get(
        f"/v1/subjects/{OWN}/usage/history",
        params={"limit": "tokens", "from": "2026-11-20", "to": "2026-11-23", "bucket": "day"},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["source"], body["bucket"]) == ("counters", "day")
    assert [(p["start"][:10], p["used"], p["maximum"]) for p in body["points"]] == [
        ("2026-11-20", 10, 2000),
        ("2026-11-21", 10, 3000),
        ("2026-11-22", 10, 3000),
    ]


def test_usage_history_by_hour_from_the_rollups(http: httpx.Client, meter: Meter) -> None:
    headers = _customer(meter)
    answer = http.get(
        f"/v1/subjects/{OWN}/usage/history",
        params={
            "limit": "api_calls",
            "from": "2026-11-22T08:00:00Z",
            "to": "2026-11-22T11:00:00Z",
            "bucket": "hour",
        },
        headers=headers,
    )
    body = answer.json()
    assert body["source"] == "rollups"
    assert [(p["start"][11:16], p["used"], p["maximum"]) for p in body["points"]] == [
        ("08:00", 0, 100),
        ("09:00", 10, 100),
        ("10:00", 0, 100),
    ]


def test_usage_history_refuses_bad_input(http: httpx.Client, meter: Meter) -> None:
    url = f"/v1/subjects/{OWN}/usage/history"
    for params, field in (
        ({"limit": "tokens", "from": "yesterday"}, "from"),
        ({"limit": "tokens", "from": "2026-11-22", "to": "2026-11-21"}, "to"),
        ({"limit": "tokens", "from": "2020-01-01", "bucket": "hour"}, "from"),
    ):
        answer = http.get(url, params=params)
        assert answer.status_code == 400, (params, answer.text)
        assert answer.json()["errors"][0]["field"] == field
    unknown = http.get(url, params={"limit": "nope"})
    assert unknown.status_code == 422 and unknown.json()["type"].endswith("unknown-limit")


def test_a_key_not_limited_to_a_subject_reads_any_subjects_history(
    http: httpx.Client, meter: Meter
) -> None:
    """(A customer's key gets 404 for another subject: `test_subject_scope.py`.)"""
    _, token = ApiKeys(meter).create("read", "an operator's")
    url = f"/v1/subjects/{OTHER}/usage/history"
    days = {"limit": "tokens", "from": "2026-11-20", "to": "2026-11-23", "bucket": "day"}
    answer = http.get(url, params=days, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200
    assert answer.json()["subject"] == OTHER
    assert [p["used"] for p in answer.json()["points"]] == [7, 7, 7 + 3]  # and its reservation
