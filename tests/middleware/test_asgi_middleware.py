"""The ASGI middleware in a FastAPI app under uvicorn, driven by httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from loopback import http_client
from servers import copy_sqlite
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection

from metering import Meter
from metering.middleware import (
    DeniedResponse,
    MeteringMiddleware,
    RequestInfo,
    Route,
    authenticated_user,
    client_ip,
)

Serve = Callable[[Any], str]  # the serve_asgi / serve_wsgi fixtures


class BearerNames(AuthenticationBackend):
    """``Authorization: Bearer NAME`` authenticates NAME (a test stand-in for real auth)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        scheme, _, name = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not name:
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(name)


def build_app(meter: Meter, *, trusted: Sequence[str] = (), **outer: Any) -> FastAPI:
    app = FastAPI()

    @app.get("/hello")
    @app.post("/upload")
    @app.get("/health")
    async def hello(request: Request) -> dict[str, Any]:
        metering = request.state.metering
        effective = metering.effective
        return {
            "limit": effective.limit if effective else None,
            "subject": effective.subject if effective else None,
            "remaining": metering.decision.remaining if metering.decision else None,
            "charges": len(metering.applied),
        }

    # Starlette runs the middleware added last outermost: per-IP, auth, per-user.
    app.add_middleware(MeteringMiddleware, meter=meter, limit="per_user", key=authenticated_user)
    app.add_middleware(AuthenticationMiddleware, backend=BearerNames())
    options: dict[str, Any] = {"stacking": True, "key": client_ip(trusted), **outer}
    app.add_middleware(MeteringMiddleware, meter=meter, limit="per_ip", **options)
    return app


def used(meter: Meter, subject: str, limit: str) -> int:
    """The counter once this process's leases are settled (a lease counts
    its whole block as used until then)."""
    meter.settle_leases(everything=True)
    return sum(c.used for c in meter.counters(subject, limit))


def test_429_with_retry_after_after_the_limit_and_headers_on_every_response(
    meter: Meter, serve_asgi: Serve
) -> None:
    base = serve_asgi(build_app(meter))
    with http_client(base_url=base) as client:
        answers = [client.get("/hello") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.headers["ratelimit"] for a in answers[:3]] == [
        f'"per_ip";r={r};t=30' for r in (2, 1, 0)
    ]
    assert all(a.headers["ratelimit-policy"] == '"per_ip";q=3;w=60' for a in answers)
    denied = answers[3]
    assert denied.headers["retry-after"] == "30"  # the calendar minute ends in 30 s
    assert denied.headers["ratelimit"] == '"per_ip";r=0;t=30'
    assert denied.headers["content-type"] == "application/json"
    body = denied.json()
    assert body["error"] == "rate_limited" and body["denied_by"] == ["per_ip"]
    assert body["retry_after"] == 30 and body["retry_at"] == "2026-11-22T12:01:00+00:00"
    assert answers[0].json() == {
        "limit": "per_ip",
        "subject": "127.0.0.1",
        "remaining": 2,
        "charges": 1,
    }
    assert used(meter, "127.0.0.1", "per_ip") == 3


def test_an_authenticated_user_gets_the_user_limit_not_the_ip_limit(
    meter: Meter, serve_asgi: Serve
) -> None:
    base = serve_asgi(build_app(meter))
    with http_client(base_url=base, headers={"authorization": "Bearer ada"}) as client:
        answers = [client.get("/hello") for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert answers[0].json() == {
        "limit": "per_user",
        "subject": "ada",
        "remaining": 4,
        "charges": 2,
    }
    assert answers[4].headers["ratelimit"] == '"per_user";r=0;t=30'
    assert answers[5].json()["denied_by"] == ["per_user"]
    assert used(meter, "ada", "per_user") == 5
    # The IP was charged only for the request the user limit denied.
    assert used(meter, "127.0.0.1", "per_ip") == 1
    assert {r.state for r in meter.reservations()} == {"cancelled", "committed"}
    with http_client(base_url=base) as anonymous:
        assert [anonymous.get("/hello").status_code for _ in range(3)] == [200, 200, 429]


def test_concurrent_requests_cannot_slip_past_an_exhausted_outer_limit(
    meter: Meter, serve_asgi: Serve
) -> None:
    base = serve_asgi(build_app(meter))

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=base) as client:
            answers = await asyncio.gather(*(client.get("/hello") for _ in range(20)))
        return [a.status_code for a in answers]

    statuses = asyncio.run(burst())
    assert sorted(statuses) == [200] * 3 + [429] * 17
    assert used(meter, "127.0.0.1", "per_ip") == 3


def test_a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored(
    meter: Meter, serve_asgi: Serve
) -> None:
    untrusting = serve_asgi(build_app(meter))
    spoofed = {"x-forwarded-for": "198.51.100.7"}
    with http_client(base_url=untrusting, headers=spoofed) as client:
        assert client.get("/hello").json()["subject"] == "127.0.0.1"
    trusting = serve_asgi(build_app(meter, trusted=["127.0.0.0/8"]))
    forwarded = {"x-forwarded-for": "203.0.113.5, 198.51.100.7, 127.0.0.2"}
    with http_client(base_url=trusting, headers=forwarded) as client:
        assert client.get("/hello").json()["subject"] == "198.51.100.7"
    assert used(meter, "198.51.100.7", "per_ip") == 1
    assert used(meter, "127.0.0.1", "per_ip") == 1


def test_routes_change_the_cost_or_exempt_and_a_custom_refusal(
    meter: Meter, serve_asgi: Serve
) -> None:
    def refuse(request: RequestInfo, decision: Any, retry_after: int) -> DeniedResponse:
        body = json.dumps({"path": request.path, "wait": retry_after}).encode()
        return DeniedResponse(503, [("content-type", "application/json")], body)

    routes = [Route("/health", exempt=True), Route("/upl*", cost=2, methods=frozenset({"POST"}))]
    base = serve_asgi(build_app(meter, routes=routes, on_denied=refuse))
    with http_client(base_url=base) as client:
        assert [client.get("/health").status_code for _ in range(5)] == [200] * 5
        assert "ratelimit" not in client.get("/health").headers
        assert client.post("/upload").json()["remaining"] == 1
        refused = client.post("/upload")
    assert refused.status_code == 503
    assert refused.json() == {"path": "/upload", "wait": 30}
    assert refused.headers["retry-after"] == "30"
    assert used(meter, "127.0.0.1", "per_ip") == 2


def test_headers_can_be_turned_off_and_an_unreachable_database_answers_503(
    meter: Meter, serve_asgi: Serve, sqlite_template: Path, tmp_path: Path
) -> None:
    base = serve_asgi(build_app(meter, headers=False))
    with http_client(base_url=base) as client:
        answer = client.get("/hello")
    assert answer.status_code == 200 and "ratelimit" not in answer.headers
    broken = Meter(copy_sqlite(sqlite_template, tmp_path / "broken.db"))
    broken.sql_engine.dispose()
    (tmp_path / "broken.db").unlink()
    (tmp_path / "broken.db").mkdir()  # no longer a database file
    closed = serve_asgi(build_app(broken))
    open_ = serve_asgi(build_app(broken, fail_open=True))
    with http_client() as client:
        assert client.get(f"{closed}/hello").status_code == 503
        assert client.get(f"{open_}/hello").status_code == 200


def test_the_headers_carry_the_subjects_own_maximum(meter: Meter, serve_asgi: Serve) -> None:
    """127.0.0.1 is entitled to 5 per window, not the limit's 3."""
    meter.set_entitlement("127.0.0.1", "per_ip", 5)
    base = serve_asgi(build_app(meter))
    with http_client(base_url=base) as client:
        answers = [client.get("/hello") for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert answers[0].headers["ratelimit-policy"] == '"per_ip";q=5;w=60'
    assert answers[0].headers["ratelimit"] == '"per_ip";r=4;t=30'
