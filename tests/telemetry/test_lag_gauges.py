"""The lag gauges of ``/metrics`` (`metering.telemetry.lag`), read from a real broker and database.

No worker runs: messages stay on the queue until the test applies their
batches itself, so depths are exact. Ages are only checked to be there.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metering import Limit, Meter
from metering.clock import FrozenClock
from metering.domain.events import make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.producer import UsageProducer
from metering.pipeline.routing import DEFAULT_QUEUE
from metering.telemetry.lag import lag_collector, read_queue_lag, read_webhook_backlog
from metering.telemetry.metrics import WebhookBacklog, exposition_registry
from metering.webhooks import Webhooks

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url) as meter:
        meter.set_limit(Limit("lag_calls", maximum=100, period="1d"))
        yield meter


def test_queue_depth_and_the_oldest_undecided_message(
    meter: Meter, pg_url: str, redis_url: str
) -> None:
    empty = read_queue_lag(pg_url, redis_url)
    assert empty.oldest_age_seconds is None
    assert dict((q, (w, u)) for q, w, u in empty.depths)[DEFAULT_QUEUE] == (0, 0)

    with UsageProducer(redis_url, batch_size=2, flush_interval_seconds=60) as producer:
        for n in range(5):
            producer.emit(f"org-{n}", "lag_calls", event_id=f"lag-{n}")
    lag = read_queue_lag(pg_url, redis_url)
    assert dict((q, (w, u)) for q, w, u in lag.depths)[DEFAULT_QUEUE] == (3, 0)
    assert lag.oldest_age_seconds is not None and lag.oldest_age_seconds >= 0

    # Once every queued event has a result, nothing on the queue is undecided.
    for payload in _payloads(redis_url):
        apply_batch(meter, payload)
    assert read_queue_lag(pg_url, redis_url).oldest_age_seconds is None


def _payloads(redis_url: str) -> list[object]:
    """The batches waiting on the default queue, as a worker decodes them."""
    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.lrange(DEFAULT_QUEUE, 0, -1)
    finally:
        client.close()
    payloads = []
    for raw in entries:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        payloads.append(json.loads(body)[0][0])
    return payloads


def test_the_webhook_backlog_counts_pending_deliveries_of_enabled_endpoints(
    db_url: str,
) -> None:
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("lag_hook", maximum=1, period="1d"))
        hooks = Webhooks(meter)
        endpoint, _ = hooks.add("https://example.com/hooks")
        assert read_webhook_backlog(db_url, clock) == WebhookBacklog(0, 0, 0.0)
        meter.consume("org-1", "lag_hook")
        meter.consume("org-1", "lag_hook")  # denied: one limit.denied delivery
        clock.advance(seconds=30)
        backlog = read_webhook_backlog(db_url, clock)
        assert (backlog.due, backlog.pending) == (1, 1)
        assert backlog.oldest_due_seconds == 30  # a frozen clock: exact
        hooks.set_enabled(endpoint.id, False)
        assert read_webhook_backlog(db_url, clock) == WebhookBacklog(0, 0, 0.0)


def test_a_broker_that_does_not_answer_is_reported_not_raised(pg_url: str, meter: Meter) -> None:
    collector = lag_collector(pg_url, "redis://127.0.0.1:1/0")
    text = generate_latest(exposition_registry([collector])).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("metering_lag_up", (("source", "broker"),))] == 0
    assert samples[("metering_lag_up", (("source", "database"),))] == 1
    assert ("metering_queue_depth", (("queue", DEFAULT_QUEUE),)) not in samples
    assert samples[("metering_webhook_backlog", ())] == 0


def test_events_rejected_in_the_last_day_are_a_gauge(db_url: str) -> None:
    clock = FrozenClock(START)
    event = make_event([("org-1", "lag_typo", 1)], START, "typo-1")
    with Meter(db_url, clock=clock) as meter:
        apply_batch(meter, encode_batch([encode_event(event)]))  # as a worker does

    def gauge() -> float:
        collector = lag_collector(db_url, "redis://127.0.0.1:1/0", clock=clock)
        text = generate_latest(exposition_registry([collector])).decode()
        [found] = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "metering_rejected_recent"
        ]
        return found

    assert gauge() == 1
    clock.advance(hours=25)
    assert gauge() == 0
