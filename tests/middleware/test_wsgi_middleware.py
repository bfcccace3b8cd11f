"""The WSGI middleware around a Flask app under waitress, driven by httpx."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flask import Flask, jsonify, request
from loopback import http_client

from metering import Meter
from metering.middleware import WSGIMeteringMiddleware, authenticated_user, client_ip

Serve = Callable[[Any], str]  # the serve_asgi / serve_wsgi fixtures
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def bearer_auth(app: WSGIApp) -> WSGIApp:
    """Sets REMOTE_USER from ``Authorization: Bearer NAME`` (stand-in for real auth)."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        scheme, _, name = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and name:
            environ["REMOTE_USER"] = name
        return app(environ, start_response)

    return wrapped


def build_app(meter: Meter, *, trusted: Sequence[str] = ()) -> Flask:
    app = Flask(__name__)

    @app.get("/hello")
    def hello() -> Any:
        metering = request.environ["metering"]
        return jsonify(
            limit=metering.effective.limit,
            subject=metering.effective.subject,
            remaining=metering.decision.remaining,
        )

    inner = WSGIMeteringMiddleware(
        app.wsgi_app, meter=meter, limit="per_user", key=authenticated_user
    )
    app.wsgi_app = WSGIMeteringMiddleware(  # type: ignore[method-assign]
        bearer_auth(inner), meter=meter, limit="per_ip", key=client_ip(trusted), stacking=True
    )
    return app


def used(meter: Meter, subject: str, limit: str) -> int:
    """The counter once this process's leases are settled (a lease counts
    its whole block as used until then)."""
    meter.settle_leases(everything=True)
    return sum(c.used for c in meter.counters(subject, limit))


def test_429_with_retry_after_and_headers(meter: Meter, serve_wsgi: Serve) -> None:
    base = serve_wsgi(build_app(meter))
    with http_client(base_url=base) as client:
        answers = [client.get("/hello") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[2].headers["ratelimit"] == '"per_ip";r=0;t=30'
    assert all(a.headers["ratelimit-policy"] == '"per_ip";q=3;w=60' for a in answers)
    assert answers[3].headers["retry-after"] == "30"
    assert answers[3].json()["denied_by"] == ["per_ip"]
    assert answers[0].json() == {"limit": "per_ip", "subject": "127.0.0.1", "remaining": 2}


def test_stacking_the_user_limit_replaces_the_ip_limit(meter: Meter, serve_wsgi: Serve) -> None:
    base = serve_wsgi(build_app(meter))
    with http_client(base_url=base, headers={"authorization": "Bearer ada"}) as client:
        answers = [client.get("/hello") for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert answers[0].json() == {"limit": "per_user", "subject": "ada", "remaining": 4}
    assert answers[0].headers["ratelimit"] == '"per_user";r=4;t=30'
    assert used(meter, "ada", "per_user") == 5
    assert used(meter, "127.0.0.1", "per_ip") == 1  # only the request the user limit denied
    assert not meter.reservations(state="held")


def test_concurrent_anonymous_requests_stop_at_the_ip_limit(
    meter: Meter, serve_wsgi: Serve
) -> None:
    base = serve_wsgi(build_app(meter))
    with http_client(base_url=base) as client, ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: client.get("/hello").status_code, range(16)))
    assert sorted(statuses) == [200] * 3 + [429] * 13


def test_forwarded_for_is_believed_only_from_trusted_proxies(
    meter: Meter, serve_wsgi: Serve
) -> None:
    spoofed = {"x-forwarded-for": "198.51.100.7"}
    with http_client(base_url=serve_wsgi(build_app(meter)), headers=spoofed) as client:
        assert client.get("/hello").json()["subject"] == "127.0.0.1"
    trusting = serve_wsgi(build_app(meter, trusted=["127.0.0.1"]))
    with http_client(base_url=trusting, headers=spoofed) as client:
        assert client.get("/hello").json()["subject"] == "198.51.100.7"
