"""Requests a client shapes to dodge or break a limit (issue 11), under real servers.

uvicorn (ASGI) and waitress (WSGI), driven by httpx, against SQLite and
PostgreSQL: odd keys are charged, not answered 500.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from flask import Flask, jsonify, request
from loopback import http_client
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection

from metering import Limit, Meter
from metering.middleware import (
    MeteringMiddleware,
    Route,
    WSGIMeteringMiddleware,
    authenticated_user,
    client_ip,
    header,
    subject_of,
)

Serve = Callable[..., str]  # the serve_asgi / serve_wsgi fixtures
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class BearerNames(AuthenticationBackend):
    """``Authorization: Bearer NAME`` authenticates NAME."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        scheme, _, name = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not name:
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(name)


def asgi_app(meter: Meter, **options: Any) -> FastAPI:
    """Every request charged to ``options`` (limit, key ...); answers who paid."""
    app = FastAPI()

    @app.get("/{rest:path}")
    async def anything(request: Request, rest: str) -> dict[str, Any]:
        effective = request.state.metering.effective
        return {"subject": effective.subject if effective else None} | (
            {"limit": effective.limit} if effective else {}
        )

    app.add_middleware(MeteringMiddleware, meter=meter, **options)
    return app


def bearer_auth(app: WSGIApp) -> WSGIApp:
    """Sets REMOTE_USER from ``Authorization: Bearer NAME``."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        scheme, _, name = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and name:
            environ["REMOTE_USER"] = name
        return app(environ, start_response)

    return wrapped


def wsgi_app(meter: Meter, **options: Any) -> WSGIApp:
    app = Flask(__name__)

    @app.get("/", defaults={"rest": ""})
    @app.get("/<path:rest>")
    def anything(rest: str) -> Any:
        effective = request.environ["metering"].effective
        if effective is None:
            return jsonify(subject=None)
        return jsonify(subject=effective.subject, limit=effective.limit)

    return bearer_auth(WSGIMeteringMiddleware(app.wsgi_app, meter=meter, **options))


def used(meter: Meter, subject: str, limit: str) -> int:
    """The counter once this process's leases are settled (a lease counts
    its whole block as used until then)."""
    meter.settle_leases(everything=True)
    return sum(c.used for c in meter.counters(subject, limit))


def statuses(client: httpx.Client, count: int, path: str = "/x", **options: Any) -> list[int]:
    return [client.get(path, **options).status_code for _ in range(count)]


# -- keys that are not valid subjects -------------------------------------------

LONG_KEY = "k" * 300
DEL_KEY = "key\x7fone"
LONG_USER = "u" * 250


def test_asgi_odd_api_keys_are_hashed_into_subjects_and_limited(
    meter: Meter, serve_asgi: Serve
) -> None:
    meter.set_limit(Limit("per_key", maximum=3, period="1m", window="calendar"))
    base = serve_asgi(asgi_app(meter, limit="per_key", key=header("X-Api-Key")))
    with http_client(base_url=base) as client:
        for key in (LONG_KEY, DEL_KEY, "h:not-a-digest"):
            sent = {"x-api-key": key.encode("latin-1")}
            assert statuses(client, 4, headers=sent) == [200, 200, 200, 429], key
            assert client.get("/x", headers={"x-api-key": "plain"}).status_code == 200
            assert used(meter, subject_of(key), "per_key") == 3
        answer = client.get("/x", headers={"x-api-key": "k" * 301})  # another key, its own count
    assert answer.status_code == 200
    assert answer.json() == {"subject": subject_of("k" * 301), "limit": "per_key"}
    assert used(meter, "plain", "per_key") == 3


def test_asgi_an_overlong_user_name_is_hashed_into_a_subject(
    meter: Meter, serve_asgi: Serve
) -> None:
    app = asgi_app(meter, limit="per_user", key=authenticated_user)
    app.add_middleware(AuthenticationMiddleware, backend=BearerNames())
    base = serve_asgi(app)
    with http_client(base_url=base, headers={"authorization": f"Bearer {LONG_USER}"}) as client:
        assert statuses(client, 6) == [200] * 5 + [429]
    assert used(meter, subject_of(LONG_USER), "per_user") == 5


def test_wsgi_odd_api_keys_and_user_names_are_hashed_into_subjects(
    meter: Meter, serve_wsgi: Serve
) -> None:
    meter.set_limit(Limit("per_key", maximum=3, period="1m", window="calendar"))
    keyed = serve_wsgi(wsgi_app(meter, limit="per_key", key=header("X-Api-Key")))
    with http_client(base_url=keyed, headers={"x-api-key": LONG_KEY}) as client:
        assert statuses(client, 4) == [200, 200, 200, 429]
    assert used(meter, subject_of(LONG_KEY), "per_key") == 3
    users = serve_wsgi(wsgi_app(meter, limit="per_user", key=authenticated_user))
    with http_client(base_url=users, headers={"authorization": f"Bearer {LONG_USER}"}) as client:
        assert statuses(client, 6) == [200] * 5 + [429]
    assert used(meter, subject_of(LONG_USER), "per_user") == 5


# -- the limit is deleted while the app runs -------------------------------------


def delete_limit_with_the_cli(db_url: str, name: str) -> None:
    command = [str(Path(sys.executable).with_name("metering")), "limits", "delete", name]
    env = {**os.environ, "METERING_DATABASE_URL": db_url}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_asgi_a_deleted_limit_answers_503_or_passes_when_fail_open(
    meter: Meter, serve_asgi: Serve, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    meter.set_limit(Limit("per_key", maximum=3, period="1m", window="calendar"))
    options = {"limit": "per_key", "key": header("X-Api-Key")}
    bases = {
        (stacking, fail_open): serve_asgi(
            asgi_app(meter, stacking=stacking, fail_open=fail_open, **options)
        )
        for stacking in (False, True)
        for fail_open in (False, True)
    }
    with http_client(headers={"x-api-key": "k-1"}) as client:
        assert [client.get(f"{b}/x").status_code for b in bases.values()] == [200] * 3 + [429]
        delete_limit_with_the_cli(db_url, "per_key")
        with caplog.at_level(logging.WARNING, logger="metering.middleware"):
            answers = {setting: client.get(f"{b}/x") for setting, b in bases.items()}
    assert {s: a.status_code for s, a in answers.items()} == {
        (False, False): 503,
        (False, True): 200,
        (True, False): 503,
        (True, True): 200,
    }
    refused = answers[(False, False)]
    assert refused.json()["error"] == "metering_unavailable"
    assert refused.headers["retry-after"] == "5"
    assert answers[(True, True)].json() == {"subject": None}  # let through uncharged
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    unknown = "unknown limit 'per_key'"
    assert sum(level == logging.ERROR and unknown in m for level, m in messages) == 2
    assert sum(level == logging.WARNING and unknown in m for level, m in messages) == 2


def test_wsgi_a_deleted_limit_answers_503_or_passes_when_fail_open(
    meter: Meter, serve_wsgi: Serve, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    meter.set_limit(Limit("per_key", maximum=3, period="1m", window="calendar"))
    options = {"limit": "per_key", "key": header("X-Api-Key")}
    closed = serve_wsgi(wsgi_app(meter, **options))
    open_ = serve_wsgi(wsgi_app(meter, fail_open=True, stacking=True, **options))
    with http_client(headers={"x-api-key": "k-1"}) as client:
        assert [client.get(f"{closed}/x").status_code for _ in range(2)] == [200, 200]
        assert client.get(f"{open_}/x").status_code == 200
        delete_limit_with_the_cli(db_url, "per_key")
        with caplog.at_level(logging.WARNING, logger="metering.middleware"):
            refused, passed = client.get(f"{closed}/x"), client.get(f"{open_}/x")
    assert refused.status_code == 503 and refused.json()["error"] == "metering_unavailable"
    assert passed.status_code == 200 and passed.json() == {"subject": None}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("unknown limit 'per_key'" in m for m in errors)


# -- paths spelt to miss a route -------------------------------------------------

ROUTES = [Route("/health", exempt=True), Route("/ip*", limit="per_path")]
PER_PATH = Limit("per_path", maximum=100, period="1m", window="calendar")


def charged_to(client: httpx.Client, base: str, target: str) -> str | None:
    """The limit a request for the raw ``target`` was charged to (None: exempt).

    httpx would resolve ``..`` itself: the target is sent as given.
    """
    answer = client.get(f"{base}/", extensions={"target": target.encode()})
    assert answer.status_code == 200, (target, answer.status_code)
    limit: str | None = answer.json().get("limit")
    return limit


def test_asgi_a_route_cannot_be_missed_by_spelling_the_path_otherwise(
    meter: Meter, serve_asgi: Serve
) -> None:
    meter.set_limit(PER_PATH)
    base = serve_asgi(asgi_app(meter, limit="per_ip", routes=ROUTES))
    spellings = ["/ip/x", "/IP/x", "//ip/x", "/Ip//x", "/./ip/x", "/x/../ip/y", "/%69p/x"]
    with http_client() as client:
        assert {p: charged_to(client, base, p) for p in spellings} == dict.fromkeys(
            spellings, "per_path"
        )
        # An exempt route is exempt as the application's router sees it, never
        # for another spelling: those are charged by the next rule that matches.
        assert charged_to(client, base, "/health") is None
        assert charged_to(client, base, "/health?verbose=1") is None
        for odd in ("/HEALTH", "//health", "/x/../health"):
            assert charged_to(client, base, odd) == "per_ip", odd
    assert used(meter, "127.0.0.1", "per_path") == len(spellings)
    assert used(meter, "127.0.0.1", "per_ip") == 3


def test_wsgi_a_route_cannot_be_missed_by_spelling_the_path_otherwise(
    meter: Meter, serve_wsgi: Serve
) -> None:
    meter.set_limit(PER_PATH)
    base = serve_wsgi(wsgi_app(meter, limit="per_ip", routes=ROUTES))
    spellings = ["/IP/x", "//ip/x", "/./ip/x", "/x/../ip/y", "/%49p/x"]
    with http_client() as client:
        assert {p: charged_to(client, base, p) for p in spellings} == dict.fromkeys(
            spellings, "per_path"
        )
        assert charged_to(client, base, "/health") is None
        assert charged_to(client, base, "/Health") == "per_ip"
    assert used(meter, "127.0.0.1", "per_path") == len(spellings)


# -- IPv6 clients ------------------------------------------------------------------

SAME_64 = ["2001:db8:1:2::a", "2001:db8:1:2:ffff:1:2:3", "2001:DB8:1:2::a:b", "2001:db8:1:2::9"]


def forwarded_for(client: httpx.Client, base: str, address: str) -> httpx.Response:
    return client.get(f"{base}/x", headers={"x-forwarded-for": address})


def test_asgi_an_ipv4_client_seen_as_ipv4_mapped_ipv6_is_keyed_by_its_ipv4_address(
    meter: Meter, serve_asgi: Serve
) -> None:
    base = serve_asgi(asgi_app(meter, limit="per_ip"), host="::ffff:127.0.0.1")
    with http_client(base_url=base) as client:
        answers = [client.get("/x") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[0].json()["subject"] == "127.0.0.1"
    assert used(meter, "127.0.0.1", "per_ip") == 3


def test_asgi_ipv6_clients_are_keyed_by_their_64_or_the_prefix_configured(
    meter: Meter, serve_asgi: Serve
) -> None:
    by_64 = serve_asgi(asgi_app(meter, limit="per_ip"), host="::1")
    by_128 = serve_asgi(asgi_app(meter, limit="per_user", key=client_ip(ipv6_prefix=128)), "::1")
    with http_client() as client:
        assert client.get(f"{by_64}/x").json()["subject"] == "::/64"
        assert client.get(f"{by_128}/x").json()["subject"] == "::1"
    proxied = serve_asgi(asgi_app(meter, limit="per_ip", key=client_ip(["127.0.0.1"])))
    with http_client() as client:
        answers = [forwarded_for(client, proxied, a) for a in SAME_64]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert answers[0].json()["subject"] == "2001:db8:1:2::/64"
        other = forwarded_for(client, proxied, "2001:db8:1:3::a")
        assert other.json()["subject"] == "2001:db8:1:3::/64"
        mapped = forwarded_for(client, proxied, "::ffff:198.51.100.7")
        assert mapped.json()["subject"] == "198.51.100.7"
    assert used(meter, "2001:db8:1:2::/64", "per_ip") == 3


def test_wsgi_ipv6_clients_are_keyed_by_their_64_and_ipv4_mapped_ones_by_ipv4(
    meter: Meter, serve_wsgi: Serve
) -> None:
    base = serve_wsgi(wsgi_app(meter, limit="per_ip", key=client_ip(["127.0.0.1"])))
    precise = serve_wsgi(
        wsgi_app(meter, limit="per_user", key=client_ip(["127.0.0.1"], ipv6_prefix=128))
    )
    with http_client() as client:
        answers = [forwarded_for(client, base, a) for a in SAME_64]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert answers[0].json()["subject"] == "2001:db8:1:2::/64"
        assert forwarded_for(client, base, "::ffff:198.51.100.7").json()["subject"] == (
            "198.51.100.7"
        )
        assert forwarded_for(client, precise, SAME_64[2]).json()["subject"] == "2001:db8:1:2::a:b"
    assert used(meter, "2001:db8:1:2::/64", "per_ip") == 3
