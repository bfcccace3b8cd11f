"""``/metrics`` of the API under uvicorn: a known stream, then the exact counts.

The API runs in the test process (single-process metrics), so counts of
other tests are there too: each check is a difference between two scrapes,
on limit names of this module.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import http_client
from prometheus_client.parser import text_string_to_metric_families

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
from metering.errors import ConfigurationError
from metering.settings import Settings, metrics_scope

Serve = Callable[[Any], str]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def meter(embedded: dict[str, str]) -> Iterator[Meter]:
    with Meter(embedded["database_url"], clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("am_calls", maximum=3, period="1h", window="calendar"))
        m.set_limit(Limit("am_soft", maximum=1, period="1h", enforcement="soft"))
        yield m


@pytest.fixture
def client(serve_api: Serve, meter: Meter, embedded: dict[str, str]) -> Iterator[httpx.Client]:
    base = serve_api(create_api(Settings(**embedded), meter=meter))
    with http_client(base_url=base, timeout=30) as http:
        yield http


def scrape(client: httpx.Client) -> Samples:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def event(event_id: str, limit: str = "am_calls", **fields: Any) -> dict[str, Any]:
    return {"event_id": event_id, "subject": "org-1", "limit": limit, "cost": 1, **fields}


def test_a_known_stream_gives_exact_counts_on_metrics(client: httpx.Client) -> None:
    before = scrape(client)
    decided = [event(f"d-{n}") for n in range(5)] + [event(f"s-{n}", "am_soft") for n in range(3)]
    answer = client.post("/v1/events", params={"wait": "decision"}, json=decided)
    assert answer.status_code == 200
    # A copy is answered from the ledger: no new decision, nothing received.
    assert client.post("/v1/events", params={"wait": "decision"}, json=decided[0]).is_success
    queued = client.post("/v1/events", json=[event(f"q-{n}") for n in range(4)])
    assert queued.status_code == 202
    assert client.post("/v1/events", json={"subject": "org-1"}).status_code == 400
    assert client.get("/v1/events/d-0").status_code == 200
    assert client.get("/v1/events/nowhere").status_code == 404
    assert client.get("/no/such/route/42").status_code == 404
    after = scrape(client)

    events = "metering_events_total"
    assert delta(before, after, events, limit="am_calls", outcome="allowed") == 3
    assert delta(before, after, events, limit="am_calls", outcome="denied") == 2
    assert delta(before, after, events, limit="am_soft", outcome="allowed") == 1
    assert delta(before, after, events, limit="am_soft", outcome="overage") == 2
    assert delta(before, after, "metering_denials_total", limit="am_calls") == 2
    repeats = "metering_events_repeated_total"
    assert delta(before, after, repeats, kind="duplicate") == 1
    received = "metering_events_received_total"
    assert delta(before, after, received, limit="am_calls") == 5 + 4
    assert delta(before, after, received, limit="am_soft") == 3

    requests = "metering_http_requests_total"
    post = {"method": "POST", "route": "/v1/events"}
    assert delta(before, after, requests, **post, status="200") == 2
    assert delta(before, after, requests, **post, status="202") == 1
    assert delta(before, after, requests, **post, status="400") == 1
    one = {"method": "GET", "route": "/v1/events/{event_id}"}
    assert delta(before, after, requests, **one, status="200") == 1
    assert delta(before, after, requests, **one, status="404") == 1
    assert delta(before, after, requests, method="GET", route="_unmatched", status="404") == 1
    # The first scrape itself is counted by the time of the second.
    assert delta(before, after, requests, method="GET", route="/metrics", status="200") == 1


def test_metrics_is_not_in_the_openapi_schema(client: httpx.Client) -> None:
    assert "/metrics" not in client.get("/openapi.json").json()["paths"]


def test_metrics_is_open_by_default_even_with_keys(
    serve_api: Serve, meter: Meter, embedded: dict[str, str]
) -> None:
    ApiKeys(meter).create("read", name="dashboard")
    base = serve_api(create_api(Settings(**embedded), meter=meter))
    with http_client(base_url=base, timeout=30) as anyone:
        assert anyone.get("/metrics").status_code == 200
        assert anyone.get("/v1/limits").status_code == 401  # the API itself asks for a key


def test_metering_metrics_scope_read_asks_for_a_read_key(
    serve_api: Serve, meter: Meter, embedded: dict[str, str]
) -> None:
    settings = Settings(**embedded, metrics_scope="read")
    base = serve_api(create_api(settings, meter=meter))
    with http_client(base_url=base, timeout=30) as anyone:
        # No key exists yet: the API is open, /metrics is not.
        refused = anyone.get("/metrics")
        assert refused.status_code == 401, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert anyone.get("/v1/limits").status_code == 200
        keys = ApiKeys(meter)
        _, ingest = keys.create("ingest", name="producer")
        _, read = keys.create("read", name="prometheus")
        wrong = anyone.get("/metrics", headers={"authorization": f"Bearer {ingest}"})
        assert wrong.status_code == 403
        scraped = anyone.get("/metrics", headers={"authorization": f"Bearer {read}"})
        assert scraped.status_code == 200
        assert "metering_http_requests_total" in scraped.text


def test_metering_metrics_scope_is_read_admin_or_unset() -> None:
    assert metrics_scope({}) is None
    assert metrics_scope({"METERING_METRICS_SCOPE": ""}) is None
    assert metrics_scope({"METERING_METRICS_SCOPE": "read"}) == "read"
    assert metrics_scope({"METERING_METRICS_SCOPE": " Admin "}) == "admin"
    assert Settings.from_env({"METERING_METRICS_SCOPE": "read"}).metrics_scope == "read"
    for bad in ("ingest", "yes", "open"):
        with pytest.raises(ConfigurationError, match="METERING_METRICS_SCOPE"):
            metrics_scope({"METERING_METRICS_SCOPE": bad})


def test_the_lag_gauges_are_on_the_apis_metrics(client: httpx.Client) -> None:
    samples = scrape(client)
    assert samples[("metering_lag_up", frozenset({("source", "broker")}))] == 1
    assert samples[("metering_lag_up", frozenset({("source", "database")}))] == 1
    assert ("metering_queue_depth", frozenset({("queue", "metering")})) in samples


@pytest.mark.server  # `metering serve` under uvicorn, in two processes
def test_metering_serve_with_two_processes_counts_exactly_and_logs_json(
    tmp_path: Path, sqlite_url: str
) -> None:
    database = sqlite_url
    with Meter(database) as meter:
        meter.set_limit(Limit("am_served", maximum=15, period="1d", window="calendar"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        METERING_DATABASE_URL=database,
        METERING_BROKER_URL=f"sqla+sqlite:///{tmp_path}/broker.db",
        METERING_LOG_FORMAT="json",
        TMPDIR=str(temporary),
    )
    command = [sys.executable, "-m", "metering", "serve", "--workers", "2", "--port", str(port)]
    log_file = tmp_path / "serve.log"
    with log_file.open("wb") as log:
        server = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(base, server, log_file)
        directories = list((temporary / "metering-metrics").iterdir())
        assert [d.name for d in directories] == [f"api-{server.pid}"]

        def post(n: int) -> int:
            body = event(f"served-{n}", "am_served")
            with http_client(base_url=base, timeout=30) as http:
                return http.post("/v1/events", params={"wait": "decision"}, json=body).status_code

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(post, range(20))) == {200}
        with http_client(base_url=base, timeout=30) as http:
            samples = scrape(http)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)

    allowed = ("metering_events_total", frozenset({("limit", "am_served"), ("outcome", "allowed")}))
    denied = ("metering_events_total", frozenset({("limit", "am_served"), ("outcome", "denied")}))
    assert (samples[allowed], samples[denied]) == (15, 5)
    posts = frozenset({("method", "POST"), ("route", "/v1/events"), ("status", "200")})
    assert samples[("metering_http_requests_total", posts)] == 20
    assert not (temporary / "metering-metrics" / f"api-{server.pid}").exists()
    lines = [line for line in log_file.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    assert any(entry["logger"] == "uvicorn.access" for entry in entries)


def _wait_until_serving(base: str, server: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + 60
    # One client for every try: `httpx.get` builds a client and its TLS
    # context each time (about 50 ms of CPU a try).
    with http_client(timeout=5) as client:
        while True:
            if server.poll() is not None:
                raise AssertionError(f"metering serve exited:\n{log_file.read_text()}")
            try:
                if client.get(f"{base}/openapi.json").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"metering serve did not answer:\n{log_file.read_text()}")
            time.sleep(0.2)
