"""Keys of the middleware (`middleware/keys.py`), with plain values; its routes
and Retry-After are in test_middleware_routes.py and test_middleware_core.py."""

from __future__ import annotations

import pytest

from metering.domain.events import validate_subject
from metering.errors import InvalidInput
from metering.middleware import (
    RequestInfo,
    authenticated_user,
    client_ip,
    header,
    subject_of,
)


def request(
    client: str | None = "10.0.0.1", forwarded: str | None = None, user: object = None
) -> RequestInfo:
    headers = {"x-forwarded-for": forwarded} if forwarded is not None else {}
    return RequestInfo("GET", "/", headers, client, user)


def test_no_proxy_is_trusted_by_default() -> None:
    key = client_ip()
    assert key(request("10.0.0.1", "203.0.113.9")) == "10.0.0.1"
    assert key(request(None)) is None
    assert key(request("unix-socket")) == "unix-socket"


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("10.0.0.1", "203.0.113.9", "203.0.113.9"),
        ("10.0.0.1", "1.1.1.1, 203.0.113.9", "203.0.113.9"),  # the left part is the client's word
        ("10.0.0.1", "203.0.113.9, 10.0.0.2", "203.0.113.9"),  # skip trusted hops
        ("10.0.0.1", "10.0.0.3, 10.0.0.2", "10.0.0.3"),  # all trusted: the leftmost
        ("10.0.0.1", "203.0.113.9, junk", "10.0.0.1"),  # malformed: trust nothing left of it
        ("10.0.0.1", "", "10.0.0.1"),
        ("10.0.0.1", "[2001:db8::1]:443", "2001:db8::/64"),
        ("10.0.0.1", "::ffff:203.0.113.9", "203.0.113.9"),
        ("::ffff:10.0.0.1", "203.0.113.9", "203.0.113.9"),  # a mapped peer is trusted as IPv4
        ("10.0.0.1", "203.0.113.9:5000", "203.0.113.9"),
        ("192.0.2.1", "203.0.113.9", "192.0.2.1"),  # peer not trusted
    ],
)
def test_forwarded_for_through_trusted_proxies(peer: str, forwarded: str, expected: str) -> None:
    assert client_ip(["10.0.0.0/8"])(request(peer, forwarded)) == expected


@pytest.mark.parametrize(
    ("peer", "prefix", "expected"),
    [
        ("2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"),
        ("2001:DB8:1:2::", 64, "2001:db8:1:2::/64"),
        ("2001:db8:1:2:3:4:5:6", 48, "2001:db8:1::/48"),
        ("2001:db8:1:2:3:4:5:6", 56, "2001:db8:1::/56"),
        ("2001:db8:1:2ff:3:4:5:6", 56, "2001:db8:1:200::/56"),
        ("2001:db8:1:2:3:4:5:6", 128, "2001:db8:1:2:3:4:5:6"),
        ("2001:db8:1:2:3:4:5:6", 0, "::/0"),
        ("::1", 64, "::/64"),
        ("::ffff:192.0.2.7", 64, "192.0.2.7"),
        ("::ffff:192.0.2.7", 128, "192.0.2.7"),
        ("192.0.2.7", 64, "192.0.2.7"),
    ],
)
def test_ipv6_clients_are_keyed_by_prefix_and_ipv4_mapped_ones_by_ipv4(
    peer: str, prefix: int, expected: str
) -> None:
    assert client_ip(ipv6_prefix=prefix)(request(peer)) == expected


@pytest.mark.parametrize("prefix", [-1, 129, True, 64.0, "64"])
def test_a_bad_ipv6_prefix_is_a_clear_error(prefix: object) -> None:
    with pytest.raises(InvalidInput, match="ipv6_prefix"):
        client_ip(ipv6_prefix=prefix)  # type: ignore[arg-type]


def test_a_bad_trusted_proxy_is_a_clear_error() -> None:
    with pytest.raises(InvalidInput, match="trusted_proxies"):
        client_ip(["10.0.0.0/33"])


class User:
    def __init__(self, name: str, authenticated: bool = True) -> None:
        self.display_name = name
        self.is_authenticated = authenticated


def test_authenticated_user_and_header_keys() -> None:
    assert authenticated_user(request(user="ada")) == "ada"
    assert authenticated_user(request(user=User("ada"))) == "ada"
    assert authenticated_user(request(user=User("", authenticated=True))) is None
    assert authenticated_user(request(user=User("ada", authenticated=False))) is None
    assert authenticated_user(request(user=None)) is None
    info = RequestInfo("GET", "/", {"x-api-key": "k-1"}, None)
    assert header("X-Api-Key")(info) == "k-1"
    assert header("X-Other")(info) is None


@pytest.mark.parametrize("key", ["ada", "k-1", "café", "a b", "x" * 200, "10.0.0.1", "h"])
def test_a_key_that_is_a_valid_subject_is_its_own_subject(key: str) -> None:
    assert subject_of(key) is key


@pytest.mark.parametrize(
    "key",
    [
        "x" * 201,
        "k" * 300,
        "key\x7fone",
        "a\x00b",
        "tab\t",
        " edge",
        "edge ",
        "",
        "\ud800",
        "h:",
        "h:0123456789abcdef0123456789abcdef",
        "\x85",
        "\xa0nbsp",
    ],
)
def test_any_other_key_is_hashed_into_a_valid_subject_of_its_own(key: str) -> None:
    subject = subject_of(key)
    assert validate_subject(subject) == subject
    assert subject.startswith("h:") and len(subject) == 34
    assert subject == subject_of(key)  # stable: the same key always pays the same counter
    assert subject_of(subject) != subject  # a client cannot send a digest to share another's
    assert subject != subject_of(key + "x")


def test_a_key_function_returning_a_non_string_is_a_clear_error() -> None:
    with pytest.raises(InvalidInput, match="key"):
        subject_of(42)  # type: ignore[arg-type]
