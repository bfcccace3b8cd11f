"""Fixtures for the webhook tests: a real HTTP receiver on loopback, and waiting.

The receiver is pytest-httpserver's threaded server on 127.0.0.1: a handler
that hangs does not block the next request. Deliveries to loopback need
``METERING_WEBHOOKS_ALLOW_PRIVATE=1``, which `allow_private` sets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from pytest_httpserver import HTTPServer

DEADLINE = 30.0


@pytest.fixture
def receiver() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        if server.is_running():
            server.stop()


@pytest.fixture
def allow_private(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METERING_WEBHOOKS_ALLOW_PRIVATE", "1")


def wait_for(
    condition: Callable[[], bool], what: Callable[[], str], timeout: float = DEADLINE
) -> None:
    """Poll until ``condition()`` holds; fail with ``what()`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s: {what()}")
        time.sleep(0.05)
