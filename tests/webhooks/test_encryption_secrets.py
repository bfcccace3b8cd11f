"""Webhook secrets at rest: Fernet under ``METERING_SECRET_KEY``, key rotation,
plaintext rows of before, and a clear error when no key decrypts a secret.

Every test reads the stored column with plain SQL on SQLite and PostgreSQL,
and proves a secret still works by a real signed delivery to a loopback
receiver, verified with the secret `add` returned.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner, Result
from cryptography.fernet import Fernet, InvalidToken
from lock_waits import wait_until_blocked
from pytest_httpserver import HTTPServer
from sqlalchemy import text

from metering import FrozenClock, Limit, Meter, errors
from metering.cli import main
from metering.webhooks import DeliverySettings, Webhooks, verify
from metering.webhooks.encryption import SecretBox

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
FAST = DeliverySettings(timeout_seconds=2.0, schedule_seconds=(0.2,), allow_private=True)
OLD_KEY = Fernet.generate_key().decode()
NEW_KEY = Fernet.generate_key().decode()


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        yield meter


def stored(meter: Meter, column: str = "secret") -> list[str | None]:
    """The column as the database holds it, endpoint by endpoint (oldest first)."""
    query = text(f"SELECT {column} FROM webhook_endpoints ORDER BY created_at_us, id")
    with meter.sql_engine.connect() as connection:
        return [row[0] for row in connection.execute(query)]


def decrypts_with(key: str, value: str) -> bool:
    token = value.removeprefix("fernet:").encode()
    try:
        Fernet(key.encode()).decrypt(token)
    except InvalidToken:
        return False
    return True


def delivered_and_verified(meter: Meter, receiver: HTTPServer, secret: str, n: int) -> None:
    """A denial of subject ``s-n`` is delivered, signed with ``secret``."""
    before = len(receiver.log)
    meter.consume(f"s-{n}", "send")
    assert not meter.consume(f"s-{n}", "send").allowed
    report = Webhooks(meter, FAST).deliver_due()
    assert report.delivered == 1, Webhooks(meter).deliveries()
    request, _ = receiver.log[before]
    verify(request.get_data(), dict(request.headers), secret, now=NOW)


def cli(meter: Meter, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, ["--database", meter.url, "webhooks", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def test_a_secret_is_stored_encrypted_and_still_signs(
    meter: Meter, receiver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METERING_SECRET_KEY", OLD_KEY)
    receiver.expect_request("/hook").respond_with_data("ok")
    endpoint, secret = Webhooks(meter).add(receiver.url_for("/hook"))
    [value] = stored(meter)
    assert value is not None and value.startswith("fernet:") and secret not in value
    assert decrypts_with(OLD_KEY, value)
    [listed] = Webhooks(meter).endpoints()
    assert listed.secret_masked == "whsec_…" + secret[-4:]
    delivered_and_verified(meter, receiver, secret, 1)
    # A rotation of the endpoint's secret keeps both encrypted.
    new_secret = Webhooks(meter).rotate(endpoint.id, grace_seconds=3600)
    [value], [previous] = stored(meter), stored(meter, "previous_secret")
    assert value is not None and previous is not None
    assert value.startswith("fernet:") and previous.startswith("fernet:")
    assert new_secret not in value and secret not in previous
    before = len(receiver.log)
    delivered_and_verified(meter, receiver, new_secret, 2)
    request, _ = receiver.log[before]
    verify(request.get_data(), dict(request.headers), secret, now=NOW)


def test_rotating_the_encryption_key(
    meter: Meter, receiver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    monkeypatch.setenv("METERING_SECRET_KEY", OLD_KEY)
    _, secret = Webhooks(meter).add(receiver.url_for("/hook"))
    # The new key first (it encrypts), the old one still decrypts.
    monkeypatch.setenv("METERING_SECRET_KEY", f"{NEW_KEY}, {OLD_KEY}")
    delivered_and_verified(meter, receiver, secret, 1)
    [value] = stored(meter)
    assert value is not None and decrypts_with(OLD_KEY, value)
    out = cli(meter, "reencrypt").output
    assert "1 endpoint" in out, out
    [value] = stored(meter)
    assert value is not None and decrypts_with(NEW_KEY, value)
    assert not decrypts_with(OLD_KEY, value)
    assert "0 endpoints" in cli(meter, "reencrypt").output  # already under the newest key
    # The old key removed: everything still works.
    monkeypatch.setenv("METERING_SECRET_KEY", NEW_KEY)
    delivered_and_verified(meter, receiver, secret, 2)
    assert "whsec_…" + secret[-4:] in cli(meter, "list").output


def test_plaintext_rows_of_before_still_sign_and_are_encrypted_by_reencrypt(
    meter: Meter, receiver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    monkeypatch.delenv("METERING_SECRET_KEY", raising=False)
    added = cli(meter, "add", receiver.url_for("/hook"))
    secret = added.stdout.splitlines()[1].split()[1]
    assert "METERING_SECRET_KEY" in added.stderr and "plaintext" in added.stderr
    endpoint_id = added.stdout.split()[1]
    cli(meter, "rotate", endpoint_id, "--grace", "3600")
    assert stored(meter, "previous_secret") == [secret]  # as stored before: plaintext
    monkeypatch.setenv("METERING_SECRET_KEY", OLD_KEY)
    assert "1 endpoint" in cli(meter, "reencrypt").output
    [value], [previous] = stored(meter), stored(meter, "previous_secret")
    assert value is not None and previous is not None
    assert decrypts_with(OLD_KEY, value) and decrypts_with(OLD_KEY, previous)
    assert secret not in previous
    delivered_and_verified(meter, receiver, secret, 1)


@pytest.mark.parametrize("key", [None, "wrong"], ids=["no key", "wrong key"])
def test_an_encrypted_secret_without_its_key_is_a_clear_error(
    meter: Meter, receiver: HTTPServer, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    monkeypatch.setenv("METERING_SECRET_KEY", OLD_KEY)
    endpoint, _ = Webhooks(meter).add(receiver.url_for("/hook"))
    if key is None:
        monkeypatch.delenv("METERING_SECRET_KEY")
    else:
        monkeypatch.setenv("METERING_SECRET_KEY", NEW_KEY)
    with pytest.raises(errors.SecretKeyError) as caught:
        Webhooks(meter).send_test(endpoint.id)
    assert isinstance(caught.value, errors.ConfigurationError)
    assert caught.value.endpoint_id == endpoint.id
    assert "METERING_SECRET_KEY" in str(caught.value)
    result = cli(meter, "test", endpoint.id, code=1)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and endpoint.id in lines[0]
    assert "Traceback" not in result.output
    # The worker records a failed attempt (no POST) and goes on with other endpoints.
    meter.consume("s-1", "send")
    meter.consume("s-1", "send")
    assert Webhooks(meter, FAST).deliver_due().retrying == 1
    [delivery] = Webhooks(meter).deliveries()
    assert "METERING_SECRET_KEY" in (delivery.last_error or "")
    assert receiver.log == []
    # The listing still works, and says the secret cannot be read.
    assert "cannot decrypt" in cli(meter, "list").output


@pytest.mark.parametrize("value", ["not-a-key", f"{OLD_KEY},short"], ids=["bad", "second bad"])
def test_a_malformed_key_is_a_configuration_error(
    meter: Meter, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("METERING_SECRET_KEY", value)
    with pytest.raises(errors.ConfigurationError, match="METERING_SECRET_KEY"):
        Webhooks(meter).add("https://example.com/hooks")
    assert stored(meter) == []
    result = cli(meter, "add", "https://example.com/hooks", code=1)
    assert result.stderr.startswith("error: ") and "METERING_SECRET_KEY" in result.stderr


def test_keygen_prints_a_key_that_works(meter: Meter, monkeypatch: pytest.MonkeyPatch) -> None:
    key = cli(meter, "keygen").stdout.strip()
    monkeypatch.setenv("METERING_SECRET_KEY", key)
    Webhooks(meter).add("https://example.com/hooks")
    [value] = stored(meter)
    assert value is not None and decrypts_with(key, value)


@pytest.mark.parametrize("operation", ["reencrypt", "rotate"])
def test_a_rotation_under_way_is_not_undone_by_a_reencryption_or_another_rotation(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    # A rotation (here written by hand, not yet committed) gives the endpoint
    # the secret `rotated`; a re-encryption, or a second rotation, that reads
    # the row meanwhile must read it after that commit, not rewrite the
    # secret it read before: the rotation's caller holds `rotated`.
    monkeypatch.setenv("METERING_SECRET_KEY", OLD_KEY)
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        endpoint, first = Webhooks(meter).add("https://example.com/hook")
        monkeypatch.setenv("METERING_SECRET_KEY", f"{NEW_KEY}, {OLD_KEY}")
        box = SecretBox.from_env()
        rotated = "whsec_" + "r" * 32
        found: list[object] = []
        with meter.sql_engine.connect() as rotation, meter.sql_engine.connect() as watcher:
            rotation.execute(
                text("UPDATE webhook_endpoints SET secret = :s, previous_secret = :p"),
                {"s": box.seal(rotated), "p": box.seal(first)},
            )
            pid = rotation.execute(text("SELECT pg_backend_pid()")).scalar_one()
            hooks = Webhooks(meter)
            work = (
                hooks.reencrypt if operation == "reencrypt" else lambda: hooks.rotate(endpoint.id)
            )
            thread = threading.Thread(target=lambda: found.append(work()))
            thread.start()
            wait_until_blocked(watcher, pid, operation)
            rotation.commit()
            thread.join(30)
        [secret], [previous] = stored(meter), stored(meter, "previous_secret")
        assert secret is not None and previous is not None
        if operation == "reencrypt":
            assert found == [0]  # it read the rotation's row: already under the newest key
            assert (box.open(secret), box.open(previous)) == (rotated, first)
        else:
            assert (box.open(secret), box.open(previous)) == (found[0], rotated)
