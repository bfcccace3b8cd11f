"""Bad input over HTTP: each case a 4xx problem+json, and nothing stored or queued.

The app runs on the embedded default in process (httpx's ASGITransport); after each bad request
the results, counters and dead letters are empty and the broker holds no
message (a good request afterwards shows the same server does store).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.api.bounds import BodyLimit, BodyTooLarge
from metering.settings import Settings

InProcess = Callable[[Any], httpx.Client]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
MAX_BYTES = 16_384
MAX_EVENTS = 5
JSON = "application/json"
CE = "application/cloudevents+json"
CE_BATCH = "application/cloudevents-batch+json"


def plain(**fields: Any) -> dict[str, Any]:
    return {"event_id": "e-1", "subject": "org-1", "limit": "api_calls", **fields}


def cloud(**fields: Any) -> dict[str, Any]:
    event = {
        "specversion": "1.0",
        "id": "ce-1",
        "source": "/billing",
        "type": "com.example.usage",
        "subject": "org-1",
        "data": {"limit": "api_calls", "cost": 1},
    }
    event.update(fields)
    return {k: v for k, v in event.items() if v is not None}


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


# (id, content type, body, status, problem type, field pointer or None)
CASES: list[tuple[str, str | None, bytes, int, str, str | None]] = [
    ("no content type", None, body(plain()), 415, "unsupported-media-type", None),
    ("text/plain", "text/plain", body(plain()), 415, "unsupported-media-type", None),
    ("form", "application/x-www-form-urlencoded", b"a=1", 415, "unsupported-media-type", None),
    ("xml", "application/xml", b"<event/>", 415, "unsupported-media-type", None),
    ("not json", JSON, b"{nope", 400, "invalid-input", "body"),
    ("empty body", JSON, b"", 400, "invalid-input", "body"),
    ("invalid utf-8", JSON, b'{"subject": "\xff\xfe"}', 400, "invalid-input", "body"),
    (
        "NaN cost",
        JSON,
        b'{"subject": "a", "limit": "api_calls", "cost": NaN}',
        400,
        "invalid-input",
        "body",
    ),
    (
        "Infinity cost",
        JSON,
        b'{"subject": "a", "limit": "api_calls", "cost": Infinity}',
        400,
        "invalid-input",
        "body",
    ),
    (
        "1e999 cost",
        JSON,
        b'{"subject": "a", "limit": "api_calls", "cost": 1e999}',
        400,
        "invalid-input",
        "body",
    ),
    (
        "NaN in metadata",
        JSON,
        b'{"subject": "a", "limit": "api_calls", "metadata": {"x": NaN}}',
        400,
        "invalid-input",
        "body",
    ),
    ("huge cost", JSON, body(plain(cost=10**30)), 400, "invalid-input", "cost"),
    (
        "5000-digit cost",
        JSON,
        b'{"subject": "a", "limit": "api_calls", "cost": ' + b"9" * 5000 + b"}",
        400,
        "invalid-input",
        "body",
    ),
    ("fractional cost", JSON, body(plain(cost=1.5)), 400, "invalid-input", "cost"),
    ("string cost", JSON, body(plain(cost="3")), 400, "invalid-input", "cost"),
    ("zero cost", JSON, body(plain(cost=0)), 400, "invalid-input", "cost"),
    ("boolean cost", JSON, body(plain(cost=True)), 400, "invalid-input", "cost"),
    ("empty subject", JSON, body(plain(subject="")), 400, "invalid-input", "subject"),
    ("control character", JSON, body(plain(subject="a\nb")), 400, "invalid-input", "subject"),
    ("bad limit name", JSON, body(plain(limit="API Calls")), 400, "invalid-input", "limit"),
    ("bad event id", JSON, body(plain(event_id="a b")), 400, "invalid-input", "event_id"),
    (
        "naive time",
        JSON,
        body(plain(occurred_at="2026-11-22T09:00:00")),
        400,
        "invalid-input",
        "occurred_at",
    ),
    (
        "future time",
        JSON,
        body(plain(occurred_at="2026-11-22T10:00:00Z")),
        400,
        "invalid-input",
        "occurred_at",
    ),
    ("unknown field", JSON, body(plain(costs=2)), 400, "invalid-input", "costs"),
    ("subject and charges", JSON, body(plain(charges=[])), 400, "invalid-input", "charges"),
    (
        "charge without limit",
        JSON,
        body({"charges": [{"subject": "a", "limit": "api_calls"}, {"subject": "b"}]}),
        400,
        "invalid-input",
        "charges[1].limit",
    ),
    (
        "repeated charge",
        JSON,
        body({"charges": [{"subject": "a", "limit": "api_calls"}] * 2}),
        400,
        "invalid-input",
        "charges",
    ),
    ("metadata not an object", JSON, body(plain(metadata=[1])), 400, "invalid-input", "metadata"),
    (
        "big metadata",
        JSON,
        body(plain(metadata={"x": "y" * 9000})),
        400,
        "invalid-input",
        "metadata",
    ),
    ("a number", JSON, b"42", 400, "invalid-input", "body"),
    ("empty array", JSON, b"[]", 400, "invalid-input", "body"),
    (
        "one bad of three",
        JSON,
        body([plain(event_id="a"), plain(event_id="b", cost=-1), plain(event_id="c")]),
        400,
        "invalid-input",
        "events[1].cost",
    ),
    ("deep nesting", JSON, b"[" * 100_000, 413, "body-too-large", None),
    (
        "deep metadata",
        JSON,
        b'{"subject": "a", "limit": "api_calls", "metadata": '
        + b'{"a": ' * 1500
        + b"1"
        + b"}" * 1501,
        400,
        "invalid-input",
        None,
    ),
    (
        "too many events",
        JSON,
        body([plain(event_id=f"e-{i}") for i in range(MAX_EVENTS + 1)]),
        413,
        "body-too-large",
        None,
    ),
    (
        "too many bytes",
        JSON,
        body(plain(metadata={"x": "y" * MAX_BYTES})),
        413,
        "body-too-large",
        None,
    ),
    ("conflict within", JSON, body([plain(cost=1), plain(cost=2)]), 409, "conflict", None),
    ("CE without id", CE, body(cloud(id=None)), 400, "invalid-input", "id"),
    ("CE without source", CE, body(cloud(source=None)), 400, "invalid-input", "source"),
    ("CE without type", CE, body(cloud(type=None)), 400, "invalid-input", "type"),
    ("CE version 0.3", CE, body(cloud(specversion="0.3")), 400, "invalid-input", "specversion"),
    ("CE without subject", CE, body(cloud(subject=None)), 400, "invalid-input", "subject"),
    ("CE without data", CE, body(cloud(data=None)), 400, "invalid-input", "data"),
    ("CE string data", CE, body(cloud(data="api_calls")), 400, "invalid-input", "data"),
    (
        "CE base64 data",
        CE,
        body(cloud(data=None, data_base64="e30=")),
        400,
        "invalid-input",
        "data_base64",
    ),
    (
        "CE xml data",
        CE,
        body(cloud(datacontenttype="application/xml")),
        400,
        "invalid-input",
        "datacontenttype",
    ),
    ("CE bad time", CE, body(cloud(time="yesterday")), 400, "invalid-input", "time"),
    (
        "CE NaN cost",
        CE,
        body(cloud()).replace(b'"cost": 1', b'"cost": NaN'),
        400,
        "invalid-input",
        "body",
    ),
    (
        "CE huge cost",
        CE,
        body(cloud(data={"limit": "api_calls", "cost": 2**70})),
        400,
        "invalid-input",
        "data.cost",
    ),
    (
        "CE bad charge",
        CE,
        body(cloud(data={"charges": [{"limit": "api_calls", "cost": 0}]})),
        400,
        "invalid-input",
        "data.charges[0].cost",
    ),
    ("CE array as structured", CE, body([cloud()]), 400, "invalid-input", "body"),
    ("CE batch not an array", CE_BATCH, body(cloud()), 400, "invalid-input", "body"),
    (
        "CE batch bad member",
        CE_BATCH,
        body([cloud(), cloud(id="ce-2", source="")]),
        400,
        "invalid-input",
        "events[1].source",
    ),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-input")


@pytest.fixture(scope="module")
def meter(workdir: Path) -> Iterator[Meter]:
    with Meter(f"sqlite:///{workdir}/metering.db", clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=5, period="1h"))
        yield m


@pytest.fixture(scope="module")
def broker_file(workdir: Path) -> Path:
    return workdir / "metering-broker.db"


@pytest.fixture(scope="module")
def client(in_process_module: InProcess, meter: Meter, broker_file: Path) -> Iterator[httpx.Client]:
    """One server for the module: every test leaves nothing stored, so they share it."""
    settings = Settings(
        database_url=meter.url,
        broker_url=f"sqla+sqlite:///{broker_file}",
        api_max_body_bytes=MAX_BYTES,
        api_max_events=MAX_EVENTS,
    )
    with in_process_module(create_api(settings, meter=meter)) as http:
        yield http


def queued_messages(broker_file: Path) -> int:
    if not broker_file.exists():
        return 0
    with sqlite3.connect(broker_file) as connection:
        tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
        if "kombu_message" not in tables:
            return 0
        return int(connection.execute("SELECT count(*) FROM kombu_message").fetchone()[0])


def assert_nothing_stored(meter: Meter, broker_file: Path) -> None:
    assert meter.count_results() == 0
    assert meter.counters() == []
    assert meter.rejected_messages() == []
    assert queued_messages(broker_file) == 0


def assert_problem(answer: httpx.Response, status: int, slug: str, field: str | None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["type"] == f"urn:metering:problem:{slug}"
    assert problem["status"] == status
    assert problem["title"] and problem["detail"]
    if field is not None:
        assert field in [e["field"] for e in problem["errors"]], problem


@pytest.mark.parametrize(
    ("content_type", "content", "status", "slug", "field"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
@pytest.mark.parametrize("wait", [False, True], ids=["queued", "wait"])
def test_bad_input_is_a_problem_and_stores_nothing(
    client: httpx.Client,
    meter: Meter,
    broker_file: Path,
    content_type: str | None,
    content: bytes,
    status: int,
    slug: str,
    field: str | None,
    wait: bool,
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    params = {"wait": "decision"} if wait else {}
    answer = client.post("/v1/events", content=content, headers=headers, params=params)
    assert_problem(answer, status, slug, field)
    assert_nothing_stored(meter, broker_file)


def test_a_chunked_body_past_the_bound_is_413(
    client: httpx.Client, meter: Meter, broker_file: Path
) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        yield b'[{"subject": "org-1", "limit": "api_calls", "metadata": {"x": "'
        for _ in range(64):
            yield b"y" * 1024
        yield b'"}}]'

    answer = client.post("/v1/events", content=chunks(), headers={"content-type": JSON})
    assert answer.request.headers["transfer-encoding"] == "chunked"
    assert_problem(answer, 413, "body-too-large", None)
    assert_nothing_stored(meter, broker_file)


def test_the_bound_stops_reading_at_the_chunk_that_crosses_it() -> None:
    """`BodyLimit` itself: the app never reads past the chunk that crosses the bound."""
    taken = 0

    async def receive() -> Message:
        nonlocal taken
        taken += 1
        return {"type": "http.request", "body": b"x" * 1000, "more_body": taken < 50}

    async def reader(scope: Scope, receive: Receive, send: Send) -> None:
        await Request(scope, receive).body()

    async def send(message: Message) -> None:
        raise AssertionError("nothing is sent: the route's handler answers")

    scope = {"type": "http", "method": "POST", "headers": [], "path": "/"}
    with pytest.raises(BodyTooLarge):
        asyncio.run(BodyLimit(reader, max_bytes=4500)(scope, receive, send))
    assert taken == 5


def test_unknown_limit_with_wait_is_422_naming_the_charge(
    client: httpx.Client, meter: Meter, broker_file: Path
) -> None:
    events = [plain(event_id="a"), plain(event_id="b", charges=None)]
    events[1] = {
        "event_id": "b",
        "charges": [{"subject": "x", "limit": "api_calls"}, {"subject": "x", "limit": "nope"}],
    }
    answer = client.post("/v1/events", params={"wait": "decision"}, json=events)
    assert_problem(answer, 422, "unknown-limit", "events[1].charges[1].limit")
    assert_nothing_stored(meter, broker_file)


def test_a_late_event_with_wait_is_400_naming_its_time(
    client: httpx.Client, meter: Meter, broker_file: Path
) -> None:
    answer = client.post(
        "/v1/events",
        params={"wait": "decision"},
        json=plain(occurred_at="2026-11-20T09:00:00Z"),  # the lateness is a day
    )
    assert_problem(answer, 400, "invalid-input", "occurred_at")
    assert_nothing_stored(meter, broker_file)


@pytest.mark.parametrize(
    ("method", "path", "status", "slug"),
    [
        ("GET", "/v1/nowhere", 404, "not-found"),
        ("DELETE", "/v1/events", 405, "method-not-allowed"),
        ("GET", "/v1/events/a%20b", 400, "invalid-input"),
        ("GET", "/v1/subjects/%20x/usage", 400, "invalid-input"),
        ("POST", "/v1/events?wait=later", 400, "invalid-input"),
    ],
)
def test_other_errors_are_problems_too(
    client: httpx.Client, method: str, path: str, status: int, slug: str
) -> None:
    answer = client.request(method, path, json=plain())
    assert_problem(answer, status, slug, None)


def test_the_same_server_stores_a_good_request(
    client: httpx.Client, meter: Meter, broker_file: Path
) -> None:
    """Last in the module: the one test that stores something."""
    assert client.post("/v1/events", params={"wait": "decision"}, json=plain()).status_code == 200
    assert meter.count_results() == 1
    assert client.post("/v1/events", json=plain(event_id="e-2")).status_code == 202
    assert queued_messages(broker_file) == 1
