"""Bounds on a request (`api/bounds.py`), on a small app in process: a body
past the bound is a 413 whether declared or counted as it arrives (a stream
route and a GET are left alone), one not in within its time a 408 (a stream
route's: each part), and a target that is not UTF-8 once percent-decoded is
a 400 before any route sees it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from metering.api.bounds import BodyLimit, Utf8Target
from metering.api.problems import install_problem_handlers

MAX = 10


async def _length(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(await request.body())))


@pytest.fixture
def client(in_process: Callable[[object], httpx.Client]) -> httpx.Client:
    paths = ["/echo", "/v1/imports"]
    app = Starlette(
        routes=[Route(p, _length, methods=["GET", "POST"]) for p in paths],
        middleware=[Middleware(Utf8Target), Middleware(BodyLimit, max_bytes=MAX)],
    )
    return in_process(app)


def _chunks(size: int) -> Iterator[bytes]:
    for _ in range(size):
        yield b"x"


def test_a_body_within_the_bound_passes(client: httpx.Client) -> None:
    assert client.post("/echo", content=b"x" * MAX).text == str(MAX)
    assert client.post("/echo", content=_chunks(MAX)).text == str(MAX)


def test_a_declared_length_past_the_bound_is_refused_before_reading(client: httpx.Client) -> None:
    answer = client.post("/echo", content=b"x" * (MAX + 1))
    assert answer.status_code == 413
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["detail"] == f"the request body exceeds {MAX} bytes"
    assert answer.headers["connection"] == "close"


def test_a_body_without_a_length_is_counted_as_it_arrives(client: httpx.Client) -> None:
    answer = client.post("/echo", content=_chunks(MAX + 1))
    assert answer.status_code == 413
    # raised inside the route's read, so the app's handler answers (here Starlette's own)
    assert answer.text == f"the request body exceeds {MAX} bytes"
    assert "connection" not in answer.headers


def test_streamed_routes_and_bodyless_methods_are_not_bounded(client: httpx.Client) -> None:
    assert client.post("/v1/imports", content=b"x" * (MAX * 3)).text == str(MAX * 3)
    assert client.request("GET", "/echo", content=b"x" * (MAX * 2)).status_code == 200


def test_a_target_that_is_not_utf8_is_refused(client: httpx.Client) -> None:
    for target, field in (("/echo%FF", "path"), ("/echo?q=%FF", "query_string")):
        answer = client.get(target)
        assert answer.status_code == 400, target
        assert answer.json()["errors"][0]["field"] == field
    assert client.get("/echo?q=%C3%A9").status_code == 200


def _slow_post(path: str, parts: list[tuple[float, bytes]], declared: int | None) -> dict[str, Any]:
    """POST ``path`` to an app whose bodies have 0.2 s (`BodyLimit`), its
    body sent as ``parts`` (each after its pause in seconds; then nothing
    more, ever): the answer's status, headers and body."""
    app = FastAPI()
    app.add_api_route(path, _length, methods=["POST"])
    install_problem_handlers(app)
    bounded = BodyLimit(app, max_bytes=MAX, timeout_seconds=0.2)
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not parts:
            await asyncio.sleep(3600)  # the client never sends the rest
        pause, body = parts.pop(0)
        await asyncio.sleep(pause)
        more = bool(parts) or declared is not None  # a declared length: more to come
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(bounded(scope, receive, send), 5))
    start, *bodies = sent
    return {
        "status": start["status"],
        "headers": {k.decode(): v.decode() for k, v in start["headers"]},
        "body": b"".join(m.get("body", b"") for m in bodies),
    }


def test_a_body_not_in_within_its_time_is_a_408_and_the_connection_closes() -> None:
    # Declared 9 bytes, sent 3: the client holds the connection and sends no more.
    answer = _slow_post("/echo", [(0, b"abc")], declared=9)
    assert (answer["status"], answer["headers"]["connection"]) == (408, "close")
    problem = json.loads(answer["body"])
    assert problem["type"] == "urn:metering:problem:request-timeout"
    assert problem["detail"] == "the request body did not arrive within 0.2 seconds"
    # The time is the whole body's: parts that each come in time, not all.
    assert _slow_post("/echo", [(0.08, b"a")] * 4, declared=None)["status"] == 408
    assert _slow_post("/echo", [(0.02, b"a")] * 4, declared=None)["body"] == b"4"


def test_a_streamed_body_has_its_time_for_each_part() -> None:
    assert _slow_post("/v1/imports", [(0.08, b"a")] * 4, declared=None)["body"] == b"4"
    assert _slow_post("/v1/imports", [(0, b"a"), (0.3, b"b")], declared=None)["status"] == 408
