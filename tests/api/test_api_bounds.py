"""Bounds on a request (`api/bounds.py`), on a small app in process: a body
past the bound is a 413 whether declared or counted as it arrives (a stream
route and a GET are left alone), and a target that is not UTF-8 once
percent-decoded is a 400 before any route sees it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from metering.api.bounds import BodyLimit, Utf8Target

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
