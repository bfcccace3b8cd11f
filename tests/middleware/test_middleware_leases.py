"""The middleware's lease mode (``leases=True``, the default): hot keys decided
from memory with the figures the exact path would give, stacked reservations
from leases, honest headers, settling at lifespan shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from flask import Flask, request
from lease_checks import counted, settled_usage
from loopback import http_client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route as StarletteRoute
from test_asgi_middleware import Serve, build_app

from metering import Limit, Meter
from metering.domain.reservations import ReservationState
from metering.middleware import MeteringMiddleware, WSGIMeteringMiddleware, client_ip


def roomy(meter: Meter) -> Meter:
    """Limits large enough to lease blocks in (the fixture's are 3 and 5)."""
    meter.set_limit(Limit("per_ip", maximum=1000, period="1m", window="calendar"))
    meter.set_limit(Limit("per_user", maximum=1000, period="1m", window="calendar"))
    return meter


def from_ip(address: str) -> dict[str, str]:
    return {"x-forwarded-for": address}


def results(meter: Meter) -> int:
    return sum(meter.outcome_counts().values())


def test_a_hot_client_gets_the_exact_paths_answers_from_memory(
    meter: Meter, serve_asgi: Serve
) -> None:
    roomy(meter)
    leased = serve_asgi(build_app(meter, trusted=["127.0.0.1"]))
    exact = serve_asgi(build_app(meter, trusted=["127.0.0.1"], leases=False))
    with http_client() as client:
        pairs = [
            (
                client.get(f"{leased}/hello", headers=from_ip("192.0.2.1")),
                client.get(f"{exact}/hello", headers=from_ip("192.0.2.2")),
            )
            for _ in range(40)
        ]
    for lease, plain in pairs:
        assert lease.status_code == plain.status_code == 200
        assert lease.json() == {**plain.json(), "subject": "192.0.2.1"}
        assert lease.headers["ratelimit"] == plain.headers["ratelimit"]
    meter.settle_leases(everything=True)
    assert counted(meter, "192.0.2.1", "per_ip") == counted(meter, "192.0.2.2", "per_ip") == 40
    assert settled_usage(meter, "192.0.2.1", "per_ip") == 40
    # The exact path recorded one event per request; the leases one per block.
    leases = meter.reservations(subject="192.0.2.1", count=1000)
    assert len(leases) < 40 and any(r.id.startswith("lease-") for r in leases)
    assert len(meter.reservations(subject="192.0.2.2", count=1000)) == 40


def test_an_authenticated_request_gives_its_leased_ip_units_back(
    meter: Meter, serve_asgi: Serve
) -> None:
    roomy(meter)
    base = serve_asgi(build_app(meter))
    with http_client(base_url=base, headers={"authorization": "Bearer ada"}) as client:
        answers = [client.get("/hello").json() for _ in range(30)]
    assert [a["remaining"] for a in answers] == list(range(999, 969, -1))
    assert {a["limit"] for a in answers} == {"per_user"}
    meter.settle_leases(everything=True)
    assert counted(meter, "ada", "per_user") == settled_usage(meter, "ada", "per_user") == 30
    # Every per-IP reservation was cancelled (given back to its lease or,
    # cold, to the counter): the IP is charged nothing.
    assert counted(meter, "127.0.0.1", "per_ip") == 0
    assert settled_usage(meter, "127.0.0.1", "per_ip") == 0


def test_remaining_counts_leases_held_by_other_processes_as_used(
    db_url: str, meter: Meter, serve_asgi: Serve
) -> None:
    roomy(meter)
    with Meter(db_url, clock=meter.clock) as other:  # a second process
        first = serve_asgi(build_app(meter))
        second = serve_asgi(build_app(other))
        with http_client() as client:
            for _ in range(14):  # 7 exact, blocks of 2 and 4 spent, one of 8 leased
                client.get(f"{first}/hello")
            assert counted(meter, "127.0.0.1", "per_ip") == 21  # 14 used, 7 held
            # The second process counts the 7 units the first holds as used.
            answer = client.get(f"{second}/hello")
            assert answer.headers["ratelimit"].startswith('"per_ip";r=978;')
            # The first counts its own 6 unused units as remaining, and what
            # others used or held when it leased the block (979 left then):
            # what others used since shows with its next block.
            answer = client.get(f"{first}/hello")
            assert answer.headers["ratelimit"].startswith('"per_ip";r=985;')
        other.settle_leases(everything=True)
    meter.settle_leases(everything=True)
    assert counted(meter, "127.0.0.1", "per_ip") == settled_usage(meter, "127.0.0.1", "per_ip")
    assert counted(meter, "127.0.0.1", "per_ip") == 16


def test_leases_false_sends_every_request_to_the_database(meter: Meter, serve_asgi: Serve) -> None:
    roomy(meter)
    app = Starlette(routes=[StarletteRoute("/", lambda _r: JSONResponse({}))])
    app.add_middleware(MeteringMiddleware, meter=meter, limit="per_ip", leases=False)
    base = serve_asgi(app)
    with http_client(base_url=base) as client:
        for _ in range(20):
            assert client.get("/").status_code == 200
    assert results(meter) == 20
    assert meter.reservations(subject="127.0.0.1") == []


def test_the_lifespan_shutdown_settles_the_leases(meter: Meter) -> None:
    roomy(meter)

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"event": request.state.metering.decision.event_id})

    app = Starlette(routes=[StarletteRoute("/", hello)])
    app.add_middleware(MeteringMiddleware, meter=meter, limit="per_ip", key=client_ip())

    async def run() -> list[str]:
        transport = httpx.ASGITransport(app=app, client=("192.0.2.9", 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            events = [(await client.get("/")).json()["event"] for _ in range(20)]
        messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
        assert [m["type"] for m in sent] == [
            "lifespan.startup.complete",
            "lifespan.shutdown.complete",
        ]
        return events

    events = asyncio.run(run())
    assert sum(e.startswith("lease-") for e in events) > 6
    held = meter.reservations(subject="192.0.2.9", state=ReservationState.HELD)
    assert held == []
    assert counted(meter, "192.0.2.9", "per_ip") == settled_usage(meter, "192.0.2.9", "per_ip")
    assert counted(meter, "192.0.2.9", "per_ip") == 20


def test_wsgi_leases_too(meter: Meter, serve_wsgi: Serve) -> None:
    roomy(meter)
    app = Flask("leases")

    @app.get("/")
    def hello() -> dict[str, Any]:
        return {"remaining": request.environ["metering"].decision.remaining}

    app.wsgi_app = WSGIMeteringMiddleware(app.wsgi_app, meter=meter, limit="per_ip")
    base = serve_wsgi(app)
    with http_client(base_url=base) as client:
        remaining = [client.get("/").json()["remaining"] for _ in range(20)]
    assert remaining == list(range(999, 979, -1))
    assert results(meter) < 20  # blocks, not requests
    meter.settle_leases(everything=True)
    assert counted(meter, "127.0.0.1", "per_ip") == settled_usage(meter, "127.0.0.1", "per_ip")
    assert counted(meter, "127.0.0.1", "per_ip") == 20
