"""Signed links to the usage page (`metering.domain.links`): a token holds its
subject until it expires, is ASCII and unpadded, at most 2,000 characters, of
one version; a time to live is 1 second to 31 days."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from metering.domain.links import parse_ttl, public_url_problem, sign, verify, verify_any
from metering.errors import InvalidInput


def _signed_as_utf8(secret: str, payload: str) -> str:
    """A token whose signature is right for a payload's UTF-8 bytes (never `sign`'s)."""
    digest = hmac.new(secret.encode(), payload.encode("utf-8"), hashlib.sha256).digest()
    return payload + "." + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_a_link_holds_its_subject_until_it_expires() -> None:
    token = sign("s3cret", "org-1/é", 1_000)
    assert verify("s3cret", token, 999) == "org-1/é"
    assert verify("s3cret", token, 1_000) is None  # expired
    assert verify("other", token, 0) is None  # another secret
    _, _, signature = token.rpartition(".")
    forged = sign("s3cret", "org-2", 1_000).rpartition(".")[0] + "." + signature
    assert verify("s3cret", forged, 0) is None
    longer = token.replace(".1000.", ".9999.")
    assert verify("s3cret", longer, 0) is None
    for junk in ("", "v1", "v1.a.b.c", None, 5, "x" * 3000):
        assert verify("s3cret", junk, 0) is None


@pytest.mark.parametrize(
    "token",
    [
        "v1.\u00e9.1795875293.x",  # non-ASCII subject part
        "v1.b3JnLTE.1795875293.\u00e9",  # non-ASCII signature
        "v1.b3JnLTE.\u0661\u0667\u0669\u0665.x",  # Arabic-Indic digits in the expiry
        "v1.b3JnLTE.\u00b2.x",  # a digit to str.isdigit, not to int()
        _signed_as_utf8("s3cret", "v1.b3JnLTE.\u0661\u0667\u0669\u0665\u0668\u0667"),
        _signed_as_utf8("s3cret", "v1.\u00e9.1795875293"),
        "v1.b3JnLTE.+1795875293.x",
        "v1.b3JnLTE. 1795875293.x",
    ],
)
def test_a_token_is_ascii_with_an_expiry_of_ascii_digits(token: str) -> None:
    assert verify("s3cret", token, 0) is None


def test_ttl_durations() -> None:
    assert parse_ttl("1h") == 3600
    assert parse_ttl("30m") == 1800
    assert parse_ttl("7d") == 7 * 86400
    assert parse_ttl("90") == 90
    for bad in ("0s", "1y", "-1h", "", "h", "40d", "\uff11h"):
        with pytest.raises(InvalidInput, match="ttl"):
            parse_ttl(bad)


def test_ttl_bounds_and_plain_seconds() -> None:
    assert parse_ttl(90) == 90
    assert parse_ttl("1s") == 1
    assert parse_ttl("31d") == 31 * 86400


def test_a_token_is_its_payload_and_its_signature_unpadded() -> None:
    # "abW" encodes to YWJX: nothing is stripped but the padding.
    assert sign("k", "abW", 1000) == "v1.YWJX.1000.N3AnuflG3rqSADomCfhXdtacae4yM1f4hG6ba5pgqK8"
    assert verify("k", sign("k", "abW", 1000), 0) == "abW"
    token = sign("k", "org-123", 1000)  # 10 characters of subject: padded back to 12
    assert token == "v1.b3JnLTEyMw.1000.youUnis7bM79hflDK8U-gR0F_m-gpqZXAquBhbS3K40"
    assert verify("k", token, 0) == "org-123"


def test_a_token_is_at_most_2000_characters() -> None:
    subject = "a" * 1461  # 1948 characters of base64
    longest = sign("k", subject, 1000)
    assert len(longest) == 2000
    assert verify("k", longest, 0) == subject
    too_long = sign("k", subject, 10000)
    assert len(too_long) == 2001
    assert verify("k", too_long, 0) is None


def test_a_token_of_another_version_is_refused_even_well_signed() -> None:
    payload = "v2.b3JnLTEyMw.1000"
    digest = hmac.new(b"k", payload.encode(), hashlib.sha256).digest()
    signature = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert verify("k", f"{payload}.{signature}", 0) is None
    assert verify("k", f"v1.b3JnLTEyMw.1000.{signature}", 0) is None


def test_a_token_verifies_with_any_of_the_secrets_given() -> None:
    token = sign("old", "org", 1_000)
    assert verify_any(["new", "old"], token, 0) == "org"
    assert verify_any(["new"], token, 0) is None
    assert verify_any([], token, 0) is None
    assert verify_any(["new", "old"], token, 1_000) is None  # expired


NOT_A_URL = "is not a URL (a port is a number from 1 to 65535)"
NOT_HTTP = "must be an http or https URL, such as https://metering.example.com"
CREDENTIALS = "must not carry a user or password"
QUERY = "must have no query or fragment: the links add their own"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://metering.example.com", None),
        ("http://metering.example.com:8080/base/path", None),
        ("HTTPS://h:1", None),
        ("https://h:65535/", None),
        ("https://[::1]:443/", None),
        ("https://h:0", "must have a port from 1 to 65535"),
        ("https://h:65536", NOT_A_URL),
        ("https://h:x", NOT_A_URL),
        ("ftp://h", NOT_HTTP),
        ("//h", NOT_HTTP),
        ("h", NOT_HTTP),
        ("https://", "must name a host"),
        ("https:///path", "must name a host"),
        ("https://u@h", CREDENTIALS),
        ("https://:p@h", CREDENTIALS),
        ("https://u:p@h", CREDENTIALS),
        ("https://h/?a=1", QUERY),
        ("https://h/#f", QUERY),
        ("https://h/?", QUERY),
        ("https://h/#", QUERY),
    ],
)
def test_a_public_url_is_http_or_https_with_a_host_and_nothing_more(
    url: str, problem: str | None
) -> None:
    assert public_url_problem(url) == problem
