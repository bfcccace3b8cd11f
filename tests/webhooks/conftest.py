"""Fixtures for the webhook tests: a real HTTP receiver on loopback.

The receiver is pytest-httpserver's threaded server on 127.0.0.1: a handler
that hangs does not block the next request. Deliveries to loopback need
``METERING_WEBHOOKS_ALLOW_PRIVATE=1``, which `allow_private` sets.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_httpserver import HTTPServer


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
