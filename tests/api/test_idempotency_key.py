"""``Idempotency-Key`` on ``POST /v1/events`` (draft-ietf-httpapi-idempotency-key-header):
the header is a single plain event's id; a body ``event_id`` may repeat it but
not contradict it; a batch or a CloudEvent with the header is refused; the
same key again answers the stored result, and the event counts once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter, spend_limit

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
EVENT = {"subject": "org-1", "limit": "calls", "cost": 2}
DECIDE = {"wait": "decision"}


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=10, period="1h"))
        yield m


def used(meter: Meter) -> int:
    return sum(c.used for c in meter.counters("org-1", "calls"))


def post(http: httpx.Client, body: Any, key: str | None, **options: Any) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return http.post("/v1/events", json=body, headers=headers, **options)


def test_the_header_alone_is_the_event_id(http: httpx.Client, meter: Meter) -> None:
    answer = post(http, EVENT, '"order-42"', params=DECIDE)  # a Structured Field string
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"][0]["event_id"] == "order-42"
    queued = post(http, EVENT, "order-43")  # a bare id too, on the queued path
    assert queued.json() == {"accepted": ["order-43"], "duplicates": []}


def test_header_and_an_equal_body_id_are_fine(http: httpx.Client) -> None:
    answer = post(http, {**EVENT, "event_id": "order-7"}, "order-7", params=DECIDE)
    assert answer.status_code == 200
    assert answer.json()["results"][0]["event_id"] == "order-7"


@pytest.mark.parametrize(
    ("body", "key", "field"),
    [
        ({**EVENT, "event_id": "order-8"}, "order-9", "event_id"),  # both, different
        ([EVENT, EVENT], "order-10", "Idempotency-Key"),  # a batch
        (EVENT, "not an id!", "Idempotency-Key"),
        (EVENT, '""', "Idempotency-Key"),
    ],
)
def test_what_the_header_cannot_go_with_is_a_400(
    http: httpx.Client, meter: Meter, body: Any, key: str, field: str
) -> None:
    for options in ({}, {"params": DECIDE}):
        answer = post(http, body, key, **options)
        assert answer.status_code == 400, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert [e["field"] for e in answer.json()["errors"]] == [field]
    assert used(meter) == 0


def test_two_keys_in_one_request_are_a_400(http: httpx.Client, meter: Meter) -> None:
    """Two header lines are one list (RFC 9110, 5.3): no one id, as ``"a", "b"``
    in one line is none. Nothing is charged under either."""
    for value in ('"order-11"', "order-12"):  # the same key twice too
        headers = [("Idempotency-Key", '"order-11"'), ("Idempotency-Key", value)]
        for options in ({}, {"params": DECIDE}):
            answer = http.post("/v1/events", json=EVENT, headers=headers, **options)
            assert answer.status_code == 400, answer.text
            assert [e["field"] for e in answer.json()["errors"]] == ["Idempotency-Key"]
    assert used(meter) == 0
    assert meter.result("order-11") is None


def test_a_cloudevent_with_the_header_is_a_400(http: httpx.Client) -> None:
    cloud = {
        "specversion": "1.0",
        "id": "c1",
        "source": "/s",
        "type": "usage",
        "data": {"subject": "org-1", "limit": "calls"},
    }
    answer = http.post(
        "/v1/events",
        content=httpx.Request("POST", "/", json=cloud).content,
        headers={"content-type": "application/cloudevents+json", "Idempotency-Key": "c1"},
    )
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "Idempotency-Key"


def test_a_repeated_key_answers_the_stored_result_once(http: httpx.Client, meter: Meter) -> None:
    first = post(http, EVENT, "order-5", params=DECIDE).json()["results"][0]
    again = post(http, EVENT, "order-5", params=DECIDE).json()["results"][0]
    queued = post(http, EVENT, "order-5").json()
    assert first["duplicate"] is False
    stored = {**first, "duplicate": True}
    assert again == stored  # the stored result, exactly, marked as a duplicate
    assert queued == {"accepted": [], "duplicates": [stored]}
    assert used(meter) == 2  # charged once
    assert meter.result("order-5") is not None


def test_a_retry_later_answers_the_stored_time_on_a_priced_limit(
    http: httpx.Client, meter: Meter
) -> None:
    meter.set_limit(spend_limit("spend", "5.00", "USD", "1mo", window="calendar"))
    meter.set_price("calls", "0.01", "USD")  # decided by the reference engine
    first = post(http, EVENT, "idem-1", params=DECIDE).json()["results"][0]
    meter.clock.advance(seconds=1.1)  # type: ignore[attr-defined]
    again = post(http, EVENT, "idem-1", params=DECIDE).json()["results"][0]
    assert first["occurred_at"] == NOW.isoformat()
    assert again == {**first, "duplicate": True}  # not the retry's arrival time
    assert used(meter) == 2


def test_the_openapi_document_says_which_wins(http: httpx.Client) -> None:
    operation = http.get("/openapi.json").json()["paths"]["/v1/events"]["post"]
    [header] = [p for p in operation["parameters"] if p["in"] == "header"]
    assert header["name"] == "Idempotency-Key"
    assert "header wins" in header["description"]
    assert "400" in header["description"]
