"""Routes of the middleware (`middleware/routes.py`), with plain values: a
route matches exactly or by prefix and method, every spelling of its path
(canonical paths), and an exempt one only the path the router sees."""

from __future__ import annotations

import pytest

from metering.middleware import (
    Route,
)
from metering.middleware.routes import canonical_path


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
