"""Standard Webhooks signatures: our `verify` against our `sign`, and rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Meter
from metering.errors import InvalidInput, MeteringError, WebhookVerificationError
from metering.webhooks import Webhooks, generate_secret, sign, verify

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
BODY = b'{"type":"limit.denied","data":{"subject":"s1"}}'


def headers_for(body: bytes, secrets: list[str] | str, at: datetime = NOW) -> dict[str, str]:
    stamp = int(at.timestamp())
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(stamp),
        "webhook-signature": sign(body, "msg_1", stamp, secrets),
    }


def test_a_generated_secret_is_whsec_and_base64_of_24_bytes() -> None:
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[6:])) == 24
    assert generate_secret() != secret


def test_the_signature_is_the_standard_webhooks_hmac() -> None:
    secret = generate_secret()
    key = base64.b64decode(secret[6:])
    digest = hmac.new(key, b"msg_1.1795000000." + BODY, hashlib.sha256).digest()
    assert sign(BODY, "msg_1", 1795000000, secret) == "v1," + base64.b64encode(digest).decode()


def test_verify_accepts_a_genuine_message_with_headers_in_any_case() -> None:
    secret = generate_secret()
    headers = {k.upper(): v for k, v in headers_for(BODY, secret).items()}
    verify(BODY, headers, secret, now=NOW + timedelta(seconds=299))
    verify(BODY.decode(), headers, secret, now=NOW - timedelta(seconds=299))


@pytest.mark.parametrize(
    "case", ["changed body", "wrong secret", "stale timestamp", "future timestamp", "no signature"]
)
def test_verify_rejects(case: str) -> None:
    secret = generate_secret()
    body, headers, now = BODY, headers_for(BODY, secret), NOW
    if case == "changed body":
        body = BODY.replace(b"s1", b"s2")
    elif case == "wrong secret":
        secret = generate_secret()
    elif case == "stale timestamp":
        now = NOW + timedelta(seconds=301)
    elif case == "future timestamp":
        now = NOW - timedelta(seconds=301)
    else:
        del headers["webhook-signature"]
    with pytest.raises(WebhookVerificationError) as caught:
        verify(body, headers, secret, now=now)
    assert isinstance(caught.value, MeteringError)


def test_a_malformed_secret_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        sign(BODY, "msg_1", 1, "whsec_not base64!")


def test_during_a_rotation_both_secrets_verify_and_after_it_only_the_new(sqlite_url: str) -> None:
    clock = FrozenClock(NOW)
    with Meter(sqlite_url, clock=clock) as meter:
        hooks = Webhooks(meter)
        endpoint, old = hooks.add("https://example.com/hooks")
        new = hooks.rotate(endpoint.id, grace_seconds=3600)
        assert new != old
        [listed] = hooks.endpoints()
        assert listed.rotating_until == NOW + timedelta(hours=1)
        assert old not in repr(listed) and new not in repr(listed)
    both = headers_for(BODY, [new, old])
    assert len(both["webhook-signature"].split()) == 2
    verify(BODY, both, old, now=NOW)
    verify(BODY, both, new, now=NOW)
    with pytest.raises(WebhookVerificationError):
        verify(BODY, headers_for(BODY, new), old, now=NOW)


STAMP = str(int(NOW.timestamp()))


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("webhook-timestamp", "1" + "0" * 400),
        ("webhook-timestamp", "9" * 5000),
        ("webhook-timestamp", "-" + STAMP),
        ("webhook-timestamp", "+" + STAMP),
        ("webhook-timestamp", f" {STAMP} "),
        ("webhook-timestamp", f"{STAMP[:4]}_{STAMP[4:]}"),
        ("webhook-timestamp", STAMP.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))),
        ("webhook-timestamp", STAMP + ".5"),
        ("webhook-timestamp", "abc"),
        ("webhook-timestamp", ""),
        ("webhook-signature", ""),
        ("webhook-signature", "   "),
        ("webhook-signature", "v1,"),
        ("webhook-signature", "v2,AAAA v1,notbase64!"),
        ("webhook-signature", "v1,é"),
    ],
)
def test_verify_rejects_a_malformed_header_with_a_verification_error(
    header: str, value: str
) -> None:
    """Each is a `WebhookVerificationError`, never an OverflowError or ValueError."""
    secret = generate_secret()
    headers = headers_for(BODY, secret) | {header: value}
    with pytest.raises(WebhookVerificationError):
        verify(BODY, headers, secret, now=NOW)
