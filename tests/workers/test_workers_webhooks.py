"""The worker's webhook delivery thread (`workers/webhooks.py`): included only
when dispatching is on; started with the worker, it delivers what is pending
within its poll interval; while the database is away it says so and waits,
and stopping (warm or cold) ends it either way."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from metering import Limit, Meter
from metering.settings import DeliverySettings, Settings
from metering.webhooks import Webhooks
from workers.app import create_app
from workers.webhooks import WebhookDelivery

WAIT_SECONDS = 20.0


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


def _parent(tmp_path: Path, database_url: str, **options: Any) -> SimpleNamespace:
    settings = Settings(
        database_url=database_url,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        webhooks_poll_seconds=0.05,
        delivery=DeliverySettings(timeout_seconds=5, allow_private=True),
        **options,
    )
    return SimpleNamespace(app=create_app(settings.broker_url, settings), hostname="w@test")


def test_the_thread_is_included_only_when_dispatching(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metering.db'}"
    on, off = _parent(tmp_path, url), _parent(tmp_path, url, webhooks_dispatch=False)
    assert WebhookDelivery(on).include_if(on) is True
    assert WebhookDelivery(off).include_if(off) is False


def test_a_started_thread_delivers_what_is_pending(
    tmp_path: Path, sqlite_url: str, receiver: HTTPServer
) -> None:
    url = sqlite_url
    receiver.expect_request("/hook").respond_with_data("ok")
    with Meter(url) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
        Webhooks(meter).add(receiver.url_for("/hook"))
        meter.consume("org", "calls")
        assert not meter.consume("org", "calls").allowed  # a denial to announce
    parent = _parent(tmp_path, url)
    step = WebhookDelivery(parent)
    step.start(parent)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not receiver.log and time.monotonic() < deadline:
            time.sleep(0.05)  # a real thread delivering, not a window of time
        assert receiver.log, "nothing was delivered"
        request, response = receiver.log[0]
        assert response.status_code == 200 and b"limit." in request.get_data()
    finally:
        step.stop(parent)
    assert step.thread is None


def test_while_the_database_is_away_it_waits_and_stops_when_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parent = _parent(tmp_path, "postgresql://nobody@127.0.0.1:1/x")
    step = WebhookDelivery(parent)
    with caplog.at_level(logging.WARNING, logger="workers.webhooks"):
        step.start(parent)
        thread = step.thread
        assert thread is not None
        deadline = time.monotonic() + WAIT_SECONDS
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.05)
        step.terminate(parent)  # a cold shutdown stops it too
    assert not thread.is_alive() and thread not in threading.enumerate()
    assert "webhook delivery waits for the database" in caplog.records[0].getMessage()
