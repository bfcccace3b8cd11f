"""Keys, routes and Retry-After of the middleware, with plain values."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering import Limit, Meter
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.events import validate_subject
from metering.errors import InvalidInput
from metering.middleware import (
    RequestInfo,
    Route,
    authenticated_user,
    client_ip,
    header,
    subject_of,
)
from metering.middleware.core import Policy, RequestMetering, Step, retry_after_seconds
from metering.middleware.routes import canonical_path

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
NOW_US = int(NOW.timestamp()) * 1_000_000


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


def test_routes_match_exactly_or_by_prefix_and_method() -> None:
    upload = Route("/upload*", cost=5, methods=frozenset({"POST"}))
    assert upload.matches("POST", "/upload/big") and upload.matches("post", "/upload")
    assert not upload.matches("GET", "/upload")
    assert Route("/health").matches("GET", "/health")
    assert not Route("/health").matches("GET", "/healthz")


@pytest.mark.parametrize(
    ("path", "canonical"),
    [
        ("/ip/x", "/ip/x"),
        ("/", "/"),
        ("", ""),
        ("//ip/x", "/ip/x"),
        ("/ip///x/", "/ip/x/"),
        ("/./ip/./x", "/ip/x"),
        ("/a/b/../../ip/x", "/ip/x"),
        ("/../../ip", "/ip"),
        ("/ip/x/..", "/ip/"),
        ("/ip/.", "/ip/"),
        ("/..", "/"),
        ("/.well-known/x", "/.well-known/x"),
        ("/%69p/%2e%2E/%49P", "/IP"),  # unreserved characters decoded, then dots resolved
        ("/a%2Fb/%25/%20", "/a%2Fb/%25/%20"),  # reserved or other characters stay encoded
        ("/IP/X", "/IP/X"),  # case is kept: routes compare it as they need
    ],
)
def test_canonical_path(path: str, canonical: str) -> None:
    assert canonical_path(path) == canonical


def test_a_canonical_path_is_returned_without_a_copy() -> None:
    path = "/api/v1/items/42"
    assert canonical_path(path) is path


@pytest.mark.parametrize("path", ["/ip/x", "/IP/x", "//ip/x", "/iP//x", "/x/../ip/y", "/%69p"])
def test_a_charging_route_matches_every_spelling_of_its_path(path: str) -> None:
    assert Route("/ip*", limit="other").matches("GET", path)


def test_a_route_path_is_normalised_too() -> None:
    route = Route("//IP/./", cost=2)
    assert route.matches("GET", "/ip/") and route.matches("GET", "/Ip//")
    assert not route.matches("GET", "/ip")


@pytest.mark.parametrize(
    ("path", "exempt"),
    [("/health", True), ("/HEALTH", False), ("//health", False), ("/x/../health", False)],
)
def test_an_exempt_route_matches_only_the_path_the_router_sees(path: str, exempt: bool) -> None:
    assert Route("/health", exempt=True).matches("GET", path) is exempt
    assert Route("/Static*", exempt=True).matches("GET", "/Static/app.js")


def charge(allowed: bool, retry_at_us: int | None, resets_at_us: int) -> ChargeDecision:
    return ChargeDecision(
        "s",
        "l",
        1,
        allowed,
        "allowed" if allowed else "denied",
        0,
        0,
        1,
        0,
        None,
        resets_at_us,
        retry_at_us,
    )


def test_retry_after_rounds_up_and_is_at_least_one_second() -> None:
    def decision(*charges: ChargeDecision) -> Decision:
        return Decision("e", "denied", charges, NOW, NOW)

    assert retry_after_seconds(decision(charge(False, NOW_US + 1_500_000, 0)), NOW_US) == 2
    assert retry_after_seconds(decision(charge(False, NOW_US, 0)), NOW_US) == 1
    never = decision(charge(False, None, NOW_US + 60_000_000))  # cost above the maximum
    assert retry_after_seconds(never, NOW_US) == 60
    both = decision(charge(True, None, 0), charge(False, NOW_US + 9_000_000, 0))
    assert retry_after_seconds(both, NOW_US) == 9


def test_a_policy_checks_its_configuration(tmp_path: object) -> None:
    with Meter(f"sqlite:///{tmp_path}/m.db") as meter:
        with pytest.raises(InvalidInput):
            Policy(meter, "api", cost=0)
        with pytest.raises(InvalidInput):
            Policy(meter, "bad name!")
        with pytest.raises(InvalidInput):
            Policy(meter, "api", routes=[Route("/x", cost=-1)])
        with pytest.raises(InvalidInput):
            Policy("not a meter", "api")  # type: ignore[arg-type]


def test_a_key_function_returning_a_non_string_answers_503_or_passes_when_fail_open(
    tmp_path: object,
) -> None:
    with Meter(f"sqlite:///{tmp_path}/m.db") as meter:
        meter.set_limit(Limit("api", maximum=5, period="1m"))
        numbered = Policy(meter, "api", key=lambda _: 42)  # type: ignore[arg-type,return-value]
        step = numbered.enter(request(), RequestMetering())
        assert step.response is not None and step.response.status == 503
        lenient = Policy(meter, "api", key=lambda _: 42, fail_open=True)  # type: ignore[arg-type,return-value]
        assert lenient.enter(request(), RequestMetering()) == Step()
