"""Fixtures for the webhook tests: a real HTTP receiver on loopback.

The receiver is pytest-httpserver's threaded server on 127.0.0.1: a handler
that hangs does not block the next request. Deliveries to loopback need
``METERING_WEBHOOKS_ALLOW_PRIVATE=1``, which `allow_private` sets. For the
destination checks, `public` (127.0.0.2, let through by `rebinding.settings_for`)
and `internal` (127.0.0.1, the same port) tell two servers apart by address only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_httpserver import HTTPServer
from rebinding import port_free_on_both


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


@pytest.fixture
def public() -> Iterator[HTTPServer]:
    """The receiver, on 127.0.0.2: 'public' for these tests (allowed_networks),
    on a port free on 127.0.0.1 too, for `internal`."""
    server = HTTPServer(host="127.0.0.2", port=port_free_on_both(), threaded=True)
    server.expect_request("/hook").respond_with_data("ok")
    server.start()
    try:
        yield server
    finally:
        server.clear()
        server.stop()


@pytest.fixture
def internal(public: HTTPServer) -> Iterator[HTTPServer]:
    """An internal service deliveries must never reach, on 127.0.0.1 and the
    receiver's port: only the address tells the two apart."""
    server = HTTPServer(host="127.0.0.1", port=public.port, threaded=True)
    server.expect_request("/hook").respond_with_data("internal")
    server.start()
    try:
        yield server
    finally:
        server.clear()
        server.stop()
