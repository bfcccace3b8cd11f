"""Webhook URLs that pass a loose check but that httpx cannot parse (issue 19, item 7).

``https://½.example``, ``http://0177.0.0.1:8080/x``, ``https://xn--.example``
... used to be stored; then ``POST .../test`` answered 500 and, in the
worker, each delivery stayed ``pending`` with no attempt, claimed again and
again with a traceback. Now they are refused when the endpoint is added or
changed (Python, CLI, HTTP), with the parser the delivery uses; and an
endpoint already stored with one gets a failed attempt, is disabled, and
nothing logs a traceback.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from metering import Limit, Meter
from metering.api import create_api
from metering.cli import main
from metering.errors import InvalidInput
from metering.settings import Settings
from metering.storage.webhook_records import EndpointRecord
from metering.storage.webhooks import WebhookStore
from metering.webhooks import DeliverySettings, Webhooks
from metering.webhooks.signing import generate_secret

UNPARSABLE = (
    "https://½.example",
    "https://a½.example",
    "http://0177.0.0.1:8080/x",
    "http://127.000.000.001:8080/x",
    "https://xn--.example",
    # A label over 63 characters: httpx builds the request, the resolver's
    # IDNA encoding refuses it (found by the stateful schemathesis run).
    "https://" + "a" * 64 + ".example",
)
SETTINGS = DeliverySettings(timeout_seconds=2.0, schedule_seconds=(0.2, 0.2), allow_private=True)
Serve = Callable[[Any], str]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        yield meter


@pytest.mark.parametrize("url", UNPARSABLE)
def test_the_library_refuses_a_url_httpx_cannot_send_to(meter: Meter, url: str) -> None:
    hooks = Webhooks(meter, SETTINGS)
    with pytest.raises(InvalidInput) as raised:
        hooks.add(url)
    assert raised.value.field == "url"
    assert "cannot be sent to" in raised.value.message
    endpoint, _ = hooks.add("https://example.com/hooks")
    with pytest.raises(InvalidInput):
        hooks.update(endpoint.id, url=url)
    assert [e.url for e in hooks.endpoints()] == ["https://example.com/hooks"]


def test_the_cli_and_the_api_refuse_them(meter: Meter, tmp_path: Path, serve_api: Serve) -> None:
    runner = CliRunner()
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db", delivery=SETTINGS)
    with httpx.Client(base_url=serve_api(create_api(settings, meter=meter))) as http:
        for url in UNPARSABLE:
            result = runner.invoke(main, ["--database", meter.url, "webhooks", "add", url])
            assert result.exit_code == 1, result.output
            lines = result.output.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: url: "), result.output
            answer = http.post("/v1/webhooks/endpoints", json={"url": url})
            assert answer.status_code == 400, answer.text
            assert answer.json()["errors"][0]["field"] == "url"
    assert Webhooks(meter).endpoints() == []


def _stored_endpoint(meter: Meter, url: str) -> str:
    """An endpoint row written as an older version could have: no validation."""
    endpoint_id = "ep_" + secrets.token_hex(8)
    record = EndpointRecord(
        id=endpoint_id,
        url=url,
        secret=generate_secret(),
        previous_secret=None,
        previous_expires_at_us=None,
        types=(),
        enabled=True,
        disabled_reason=None,
        created_at_us=meter.database.now_us(),
    )
    meter.database.run(lambda c: WebhookStore(c).insert_endpoint(record))
    return endpoint_id


@pytest.mark.parametrize("url", UNPARSABLE)
def test_a_stored_unsendable_url_fails_an_attempt_without_a_traceback(
    meter: Meter, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint_id = _stored_endpoint(meter, url)
    hooks = Webhooks(meter, SETTINGS)
    meter.consume("visitor-1", "send")
    assert not meter.consume("visitor-1", "send").allowed  # limit.denied is queued
    with caplog.at_level(logging.DEBUG):
        report = hooks.deliver_due()
    assert report.failed == 1 and report.retrying == 0, report
    [delivery] = hooks.deliveries()
    assert delivery.status == "failed" and delivery.attempts == 1
    [attempt] = hooks.attempts(delivery.id)
    assert attempt.status_code is None and "cannot be sent to" in (attempt.error or "")
    endpoint = hooks.get(endpoint_id)
    assert not endpoint.enabled and "cannot be sent to" in (endpoint.disabled_reason or "")
    assert hooks.deliver_due().to_dict() == {"delivered": 0, "retrying": 0, "failed": 0}
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_a_test_ping_to_a_stored_unsendable_url_is_a_failed_attempt(
    meter: Meter, tmp_path: Path, serve_api: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint_id = _stored_endpoint(meter, "https://½.example/hooks")
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db", delivery=SETTINGS)
    with (
        caplog.at_level(logging.DEBUG),
        httpx.Client(base_url=serve_api(create_api(settings, meter=meter))) as http,
    ):
        answer = http.post(f"/v1/webhooks/endpoints/{endpoint_id}/test")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "failed" and body["attempt_log"][0]["status_code"] is None
    assert "cannot be sent to" in body["attempt_log"][0]["error"]
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
