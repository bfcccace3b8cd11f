"""``GET /v1/rejected``: what the workers could not apply, newest first, as
`metering rejected` lists it (an admin's key: the input of every subject)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from metering import FrozenClock, Limit, Meter, make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=10, period="1h", window="calendar"))
        yield m


def test_events_the_workers_rejected_are_listed_with_their_reason(
    http: httpx.Client, meter: Meter
) -> None:
    assert http.get("/v1/rejected").json() == {"rejected": []}
    typo = make_event([("org-42", "api_cals", 3)], NOW, "typo-1")
    apply_batch(meter, encode_batch([encode_event(typo)]))  # as a worker does
    apply_batch(meter, {"not": "a batch"})
    answer = http.get("/v1/rejected", params={"count": 1})
    assert answer.status_code == 200, answer.text
    [newest] = answer.json()["rejected"]
    assert newest["event_id"] is None and "not a metering batch" in newest["reason"]
    both = http.get("/v1/rejected").json()["rejected"]
    assert both[1]["event_id"] == "typo-1"
    assert both[1]["reason"] == "unknown limit 'api_cals': define it with `metering limits set`"
    assert '"api_cals"' in both[1]["raw"]
    assert http.get("/v1/rejected", params={"count": 0}).status_code == 400
