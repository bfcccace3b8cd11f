"""``metering webhooks`` (`metering/cli/webhooks.py`) on the embedded default:
./metering.db in a temp directory, deliveries to a real receiver on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pytest_httpserver import HTTPServer

from metering import Limit, Meter
from metering.cli import main
from metering.webhooks import Webhooks

Run = Callable[..., Result]


@pytest.fixture
def receiver() -> Iterator[HTTPServer]:
    """pytest-httpserver's threaded server on 127.0.0.1 (as tests/webhooks/conftest.py's)."""
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        if server.is_running():
            server.stop()


@pytest.fixture
def run(tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    """``metering ARGS`` in ``tmp_path``, on its default ./metering.db (put
    there migrated by `sqlite_url`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_DATABASE_URL", raising=False)
    monkeypatch.setenv("METERING_WEBHOOKS_ALLOW_PRIVATE", "1")
    monkeypatch.setenv("METERING_WEBHOOKS_SCHEDULE", "0.1")
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> Result:
        result = runner.invoke(main, list(args))
        assert result.exit_code == code, (result.output, result.exception)
        return result

    return invoke


def add(run: Run, url: str, *extra: str) -> tuple[str, str]:
    lines = run("webhooks", "add", url, *extra).output.splitlines()
    endpoint_id = lines[0].split()[1]
    secret = lines[1].split()[1]
    return endpoint_id, secret


def test_add_list_disable_enable_remove(run: Run, tmp_path: Path) -> None:
    endpoint_id, secret = add(run, "https://example.com/hooks", "--types", "limit.denied")
    assert endpoint_id.startswith("ep_") and secret.startswith("whsec_")
    assert (tmp_path / "metering.db").exists()
    listing = run("webhooks", "list").output
    assert endpoint_id in listing and "limit.denied" in listing and "enabled" in listing
    assert secret not in listing and secret[-4:] in listing
    as_json = json.loads(run("webhooks", "list", "--format", "json").output)
    assert as_json[0]["secret"] == "whsec_…" + secret[-4:]
    run("webhooks", "disable", endpoint_id)
    assert json.loads(run("webhooks", "list", "--format", "json").output)[0]["enabled"] is False
    run("webhooks", "enable", endpoint_id)
    assert json.loads(run("webhooks", "list", "--format", "json").output)[0]["enabled"] is True
    rotated = run("webhooks", "rotate", endpoint_id).output
    assert "whsec_" in rotated and secret not in rotated
    run("webhooks", "remove", endpoint_id)
    assert run("webhooks", "list").output.strip() == "no webhook endpoints"


def test_a_given_secret_is_kept(run: Run) -> None:
    _, secret = add(run, "https://example.com/h", "--secret", "whsec_" + "A" * 32)
    assert secret == "whsec_" + "A" * 32


@pytest.mark.parametrize(
    "args",
    [
        ("webhooks", "add", "ftp://example.com/x"),
        ("webhooks", "add", "not a url"),
        ("webhooks", "add", "https:///nohost"),
        ("webhooks", "add", "https://example.com", "--secret", "nope!"),
        ("webhooks", "add", "https://example.com", "--types", "limit.bogus"),
        ("webhooks", "remove", "ep_missing"),
        ("webhooks", "test", "ep_missing"),
        ("webhooks", "replay"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(run: Run, args: tuple[str, ...]) -> None:
    result = run(*args, code=1)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output


def test_deliveries_replay_and_test_against_a_loopback_receiver(
    run: Run, tmp_path: Path, receiver: HTTPServer
) -> None:
    receiver.expect_request("/hook").respond_with_data("no", status=500)
    endpoint_id, _ = add(run, receiver.url_for("/hook"))
    with Meter(f"sqlite:///{tmp_path}/metering.db") as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        meter.consume("visitor-1", "send")
        meter.consume("visitor-1", "send")
    table = run("webhooks", "deliveries").output
    assert "limit.denied" in table and "pending" in table

    with Meter(f"sqlite:///{tmp_path}/metering.db") as meter:
        hooks = Webhooks(meter)
        hooks.deliver_due()
        deadline = time.monotonic() + 30
        while hooks.deliveries()[0].status == "pending" and time.monotonic() < deadline:
            time.sleep(0.1)
            hooks.deliver_due()
    [failed] = json.loads(
        run("webhooks", "deliveries", "--status", "failed", "--format", "json").output
    )
    assert failed["type"] == "limit.denied" and failed["attempts"] == 2
    assert [a["status_code"] for a in failed["attempt_log"]] == [500, 500]

    receiver.clear()
    receiver.expect_request("/hook").respond_with_data("ok")
    assert "1 deliveries queued again" in run("webhooks", "replay", str(failed["id"])).output
    with Meter(f"sqlite:///{tmp_path}/metering.db") as meter:
        Webhooks(meter).deliver_due()
    [again] = json.loads(run("webhooks", "deliveries", "--format", "json").output)
    assert again["status"] == "delivered" and len(again["attempt_log"]) == 3
    assert "1 deliveries queued again" in run("webhooks", "replay", "--since", "2000-01-01").output

    ping = run("webhooks", "test", endpoint_id).output
    assert ping.startswith(f"delivered {endpoint_id}: HTTP 200")
    request, _ = receiver.log[-1]
    assert request.json["type"] == "webhook.test" and request.headers[
        "webhook-signature"
    ].startswith("v1,")

    receiver.clear()
    receiver.expect_request("/hook").respond_with_data("down", status=503)
    assert "failed" in run("webhooks", "test", endpoint_id, code=1).output


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://alice:s3cr3t-pw@hooks.example.com/in", "https://alice:***@hooks.example.com/in"),
        (
            "https://tok_abcdef123@hooks.example.com:8443/in",
            "https://***@hooks.example.com:8443/in",
        ),
        ("http://u:p%40ss@[2001:db8::1]:8080/x?y=1", "http://u:***@[2001:db8::1]:8080/x?y=1"),
        ("https://hooks.example.com/in", "https://hooks.example.com/in"),
    ],
)
def test_credentials_in_an_endpoint_url_are_masked(run: Run, url: str, shown: str) -> None:
    added = run("webhooks", "add", url).output
    listing = run("webhooks", "list").output
    as_json = run("webhooks", "list", "--format", "json").output
    secret_part = url.split("//")[1].split("@")[0] if "@" in url else None
    for output in (added, listing, as_json):
        if secret_part is not None:
            assert secret_part.split(":")[-1] not in output, output
    assert json.loads(as_json)[0]["url"] == shown
    assert shown in added


def test_a_test_ping_reaches_an_endpoint_that_chose_its_types(
    run: Run, receiver: HTTPServer
) -> None:
    """`--types` cannot name webhook.test, yet the ping must go out (it crashed)."""
    receiver.expect_request("/hook").respond_with_data("ok")
    endpoint_id, _ = add(run, receiver.url_for("/hook"), "--types", "limit.denied")
    ping = run("webhooks", "test", endpoint_id)
    assert ping.output.startswith(f"delivered {endpoint_id}: HTTP 200")
    request, _ = receiver.log[-1]
    assert request.json["type"] == "webhook.test"


def test_replay_of_unknown_ids_is_an_error(run: Run, tmp_path: Path) -> None:
    endpoint_id, _ = add(run, "https://example.com/hook")
    with Meter(f"sqlite:///{tmp_path}/metering.db") as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        meter.consume("visitor-1", "send")
        meter.consume("visitor-1", "send")
        [known] = Webhooks(meter).deliveries()
    unknown = run("webhooks", "replay", "999999", code=1)
    assert unknown.stderr == "error: no delivery 999999\n" and unknown.stdout == ""
    some = run("webhooks", "replay", str(known.id), "999998", "999999", code=1)
    assert some.stderr == (
        "error: no deliveries 999998, 999999 (of 3 ids given); 1 delivery queued again\n"
    )
    assert run("webhooks", "replay", str(known.id)).output == "1 deliveries queued again\n"
    assert endpoint_id == known.endpoint_id


def test_add_warns_when_deliveries_to_the_url_will_be_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("METERING_WEBHOOKS_ALLOW_PRIVATE")
    result = run("webhooks", "add", "http://127.0.0.1:9000/hooks")
    assert result.stdout.startswith("added ep_")
    assert "warning: deliveries will be refused: 127.0.0.1 resolves to 127.0.0.1, a loopback" in (
        result.stderr
    )
    assert "METERING_WEBHOOKS_ALLOW_PRIVATE=1" in result.stderr
    assert "METERING_WEBHOOKS_ALLOW_NETWORKS" in result.stderr
    monkeypatch.setenv("METERING_WEBHOOKS_ALLOW_NETWORKS", "127.0.0.0/8")
    assert "refused" not in run("webhooks", "add", "http://127.0.0.1:9000/hooks").stderr


def test_add_says_nothing_of_a_public_or_allowed_url(run: Run) -> None:
    # `run` allows private destinations (METERING_WEBHOOKS_ALLOW_PRIVATE=1).
    assert "refused" not in run("webhooks", "add", "http://127.0.0.1:9000/hooks").stderr
    assert "refused" not in run("webhooks", "add", "https://93.184.215.14/hooks").stderr
