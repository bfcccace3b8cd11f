"""Bounds on a request body, enforced while it is read.

`BodyLimit` is ASGI middleware: a ``Content-Length`` past the bound is
refused before a byte of the body is read, and a body without one (chunked)
is counted as it arrives, so the server never buffers more than the bound
(a 413 problem); a body not all in within its time is a 408 problem (a
streamed route's: each part). The events in one request are bounded where
they are parsed (`metering.api.parsing`).

`Utf8Target` refuses a path or query string whose percent-escapes are not
UTF-8 (``/v1/subjects/%FF/usage``) with a 400, before any route sees it: the
server would otherwise decode ``%FF`` as U+FFFD and serve another name.
"""

from __future__ import annotations

import asyncio
from typing import Final
from urllib.parse import unquote_to_bytes

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from metering.api.problems import problem_response

BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Routes that read their body as a stream, a batch at a time, and never hold
# it whole (``POST /v1/imports``, admin only): not bounded here.
STREAMED_PATHS: Final = frozenset({"/v1/imports"})


class BodyTooLarge(HTTPException):
    """Raised from the body's read; an `HTTPException`, so FastAPI's own body
    parsing lets it through to the 413 problem (it turns other errors into 400)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body exceeds {max_bytes} bytes")


class BodyTooSlow(HTTPException):
    """Raised from the body's read, as `BodyTooLarge`: the 408 problem, and the
    connection closed (the rest of the body is never read)."""

    def __init__(self, seconds: float) -> None:
        detail = f"the request body did not arrive within {seconds:g} seconds"
        super().__init__(408, detail, headers={"connection": "close"})


class BodyLimit:
    """Refuse request bodies larger than ``max_bytes`` with 413, and those not
    read within ``timeout_seconds`` (a streamed route's: each part) with 408."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_seconds: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        streamed = scope["path"] in STREAMED_PATHS
        declared = _content_length(scope)
        if not streamed and declared is not None and declared > self.max_bytes:
            await _refuse(self.max_bytes, scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_seconds
        received, whole = 0, False

        async def bounded() -> Message:
            nonlocal received, whole
            if whole:  # a wait for the client's disconnect, after the body
                return await receive()
            wait = self.timeout_seconds if streamed else deadline - loop.time()
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except TimeoutError:
                # Raised inside the route's read: its exception handler answers.
                raise BodyTooSlow(self.timeout_seconds) from None
            if message["type"] == "http.request":
                whole = not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > self.max_bytes and not streamed:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, bounded, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(max_bytes: int, scope: Scope, receive: Receive, send: Send) -> None:
    response = problem_response(
        "body-too-large",
        f"the request body exceeds {max_bytes} bytes",
        headers={"connection": "close"},
    )
    await response(scope, receive, send)


class Utf8Target:
    """Refuse a request whose path or query string is not UTF-8 once
    percent-decoded (400): ``%FF`` is no character, not U+FFFD."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw_path = scope.get("raw_path") or scope["path"].encode()
            query = scope.get("query_string", b"").replace(b"+", b" ")
            for part, text in (("path", raw_path), ("query string", query)):
                try:
                    unquote_to_bytes(text).decode("utf-8")
                except UnicodeDecodeError:
                    response = problem_response(
                        "invalid-input",
                        f"the {part} is not UTF-8 once percent-decoded (%XX escapes)",
                        [(part.replace(" ", "_"), "is not UTF-8 once percent-decoded")],
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
