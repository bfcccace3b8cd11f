"""Exactly once over HTTP: PostgreSQL, Redis, a real worker, uvicorn, httpx.

The same batch of 100 events is POSTed three times, then by 8 clients at
once; the worker applies what was queued. Every event is counted once: one
result per id, the counters equal one application of the batch, nothing in
the dead-letter record. With ``?wait=decision`` the same holds without the
queue, and every copy gets the one decision (marked ``duplicate``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis
from loopback import http_client

from metering import Limit, Meter
from metering.api import create_api
from metering.settings import Settings

Serve = Callable[[Any], str]
SUBJECTS = 10
EVENTS = 100
CLIENTS = 8
WAIT_SECONDS = 60.0


def the_batch() -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"batch-{i}",
            "subject": f"org-{i % SUBJECTS}",
            "limit": "api_calls",
            "cost": 1 + i % 3,
            "metadata": {"n": i},
        }
        for i in range(EVENTS)
    ]


def expected_used() -> dict[str, int]:
    used: Counter[str] = Counter()
    for event in the_batch():
        used[event["subject"]] += event["cost"]
    return dict(used)


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url) as m:
        m.set_limit(Limit("api_calls", maximum=1_000_000, period="1h", window="calendar"))
        yield m


@pytest.fixture
def base(serve_api: Serve, meter: Meter, redis_url: str) -> str:
    return serve_api(create_api(Settings(meter.url, redis_url), meter=meter))


def used_by_subject(meter: Meter) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for counter in meter.counters(limit="api_calls"):
        totals[counter.subject] += counter.used
    return dict(totals)


def post_concurrently(base: str, params: dict[str, str]) -> list[httpx.Response]:
    def post(_: int) -> httpx.Response:
        with http_client(base_url=base, timeout=60) as client:
            return client.post("/v1/events", json=the_batch(), params=params)

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(post, range(CLIENTS)))


def wait_until_drained(meter: Meter, broker: redis.Redis) -> None:
    """Every id decided, and nothing left on the queue or unacknowledged."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        idle = broker.llen("metering") == 0 and broker.hlen("unacked") == 0
        if meter.count_results() == EVENTS and idle:
            return
        assert time.monotonic() < deadline, (meter.count_results(), idle)
        time.sleep(0.1)


@pytest.fixture
def broker(redis_server: Any, redis_url: str) -> Iterator[redis.Redis]:
    with redis_server.client() as client:
        yield client


def test_a_batch_posted_3_times_and_by_8_clients_at_once_is_counted_once(
    base: str, meter: Meter, api_worker: Any, broker: redis.Redis
) -> None:
    ids = [event["event_id"] for event in the_batch()]
    answers = []
    with http_client(base_url=base, timeout=60) as client:
        for _ in range(3):
            answers.append(client.post("/v1/events", json=the_batch()))
    answers += post_concurrently(base, {})
    assert [a.status_code for a in answers] == [202] * (3 + CLIENTS)
    for answer in answers:  # each id answered: queued, or decided before
        body = answer.json()
        assert sorted(body["accepted"] + [d["event_id"] for d in body["duplicates"]]) == sorted(ids)
    wait_until_drained(meter, broker)
    assert used_by_subject(meter) == expected_used()
    assert meter.outcome_counts() == {"allowed": EVENTS}
    assert meter.rejected_messages() == []
    with http_client(base_url=base, timeout=60) as client:
        result = client.get("/v1/events/batch-7").json()
        assert (result["status"], result["outcome"], result["metadata"]) == (
            "decided",
            "allowed",
            {"n": 7},
        )
        again = client.post("/v1/events", json=the_batch()).json()
    assert again["accepted"] == []
    assert len(again["duplicates"]) == EVENTS


def test_a_queued_event_is_pending_until_a_worker_applies_it(
    base: str, meter: Meter, request: pytest.FixtureRequest
) -> None:
    event = {"event_id": "late-1", "subject": "org-1", "limit": "api_calls", "cost": 4}
    with http_client(base_url=base, timeout=60) as client:
        assert client.post("/v1/events", json=event).status_code == 202
        assert client.get("/v1/events/late-1").json() == {"status": "pending", "event_id": "late-1"}
        request.getfixturevalue("api_worker")
        deadline = time.monotonic() + WAIT_SECONDS
        while (answer := client.get("/v1/events/late-1").json())["status"] == "pending":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert (answer["outcome"], answer["used"]) == ("allowed", 4)


def test_wait_decision_from_8_clients_at_once_is_counted_once(base: str, meter: Meter) -> None:
    answers = post_concurrently(base, {"wait": "decision"})
    assert [a.status_code for a in answers] == [200] * CLIENTS
    results = [answer.json()["results"] for answer in answers]
    assert all(
        [r["event_id"] for r in rs] == [e["event_id"] for e in the_batch()] for rs in results
    )
    # Each id decided once: one copy new, the others that decision again.
    for index in range(EVENTS):
        copies = [rs[index] for rs in results]
        assert sum(not c["duplicate"] for c in copies) == 1
        assert len({(c["decided_at"], c["used"]) for c in copies}) == 1
    assert used_by_subject(meter) == expected_used()
    assert meter.count_results() == EVENTS


def test_a_conflicting_copy_is_409_and_changes_nothing(base: str, meter: Meter) -> None:
    with http_client(base_url=base, timeout=60) as client:
        first = client.post("/v1/events", json=the_batch(), params={"wait": "decision"})
        assert first.status_code == 200
        changed = the_batch()
        changed[5]["cost"] += 1
        for params in ({}, {"wait": "decision"}):
            answer = client.post("/v1/events", json=changed, params=params)
            assert answer.status_code == 409
            assert answer.json()["event_ids"] == ["batch-5"]
    assert used_by_subject(meter) == expected_used()
    assert meter.count_results() == EVENTS


def mixed_requests(requests: int, at: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """``requests`` bodies of 100 new events each, every shape the queued path
    parses: the usual event (one pass), a subject that JSON escapes, stacked
    charges, a time, a CloudEvents batch (content type, body)."""
    bodies: list[tuple[str, list[dict[str, Any]]]] = []
    for r in range(requests):
        if r % 5 == 4:
            bodies.append(
                (
                    "application/cloudevents-batch+json",
                    [
                        {
                            "specversion": "1.0",
                            "id": f"ce-{r}-{i}",
                            "source": "/tests",
                            "type": "usage",
                            "subject": f"org-{i % SUBJECTS}",
                            "data": {"limit": "api_calls", "cost": 2},
                        }
                        for i in range(EVENTS)
                    ],
                )
            )
            continue
        events: list[dict[str, Any]] = []
        for i in range(EVENTS):
            event: dict[str, Any] = {"event_id": f"m-{r}-{i}", "limit": "api_calls"}
            if i % 10 == 3:
                event["subject"] = f'org-é"{i % SUBJECTS}'
            elif i % 10 == 7:
                del event["limit"]
                event["charges"] = [
                    {"subject": f"org-{i % SUBJECTS}", "limit": "api_calls", "cost": 1},
                    {"subject": f"team-{i % 3}", "limit": "api_calls", "cost": 2},
                ]
            else:
                event["subject"] = f"org-{i % SUBJECTS}"
                event["cost"] = 1 + i % 3
                event["metadata"] = {"n": i}
            if i % 2:
                event["occurred_at"] = at
            events.append(event)
        bodies.append(("application/json", events))
    return bodies


def test_batches_posted_over_http_each_get_exactly_one_result_from_a_real_worker(
    serve_api: Serve, pg_url: str, redis_url: str, api_worker: Any, broker: redis.Redis
) -> None:
    """Many requests of 100 events at once, from 4 clients: each request's
    events go out as one message of the API's own text (`QueuedEvent`),
    which the worker decodes and applies: one result per id, the counters
    one application of every event, nothing dead-lettered."""
    requests = 20
    at = (datetime.now(UTC) - timedelta(seconds=30)).isoformat()
    bodies = mixed_requests(requests, at)
    expected: Counter[str] = Counter()
    for _, events in bodies:
        for e in events:
            if "data" in e:  # a CloudEvent
                expected[e["subject"]] += e["data"]["cost"]
                continue
            for charge in e.get("charges") or [e]:
                expected[charge["subject"]] += charge.get("cost", 1)
    with Meter(pg_url) as meter:
        meter.set_limit(Limit("api_calls", maximum=10**9, period="1d", window="calendar"))
        base = serve_api(create_api(Settings(meter.url, redis_url), meter=meter))

        def post(index: int) -> httpx.Response:
            kind, events = bodies[index]
            with http_client(base_url=base, timeout=60) as client:
                return client.post(
                    "/v1/events", content=json.dumps(events), headers={"content-type": kind}
                )

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, range(requests)))
        assert [a.status_code for a in answers] == [202] * requests
        assert sum(len(a.json()["accepted"]) for a in answers) == requests * EVENTS
        deadline = time.monotonic() + WAIT_SECONDS
        while meter.count_results() < requests * EVENTS or broker.llen("metering"):
            assert time.monotonic() < deadline, meter.count_results()
            time.sleep(0.1)
        assert meter.count_results() == requests * EVENTS
        assert meter.outcome_counts() == {"allowed": requests * EVENTS}
        assert used_by_subject(meter) == dict(expected)
        assert meter.rejected_messages() == []
