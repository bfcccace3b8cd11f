"""The app `bench_middleware.py` serves: FastAPI, with or without the middleware.

``METERING_BENCH_MODE``: ``none`` (no middleware), ``ip`` (one per-IP
limit), ``stacked`` (per-IP stacking reservation, authentication, per-user).
``METERING_BENCH_LEASES``: ``1`` (the default: quota leases) or ``0``
(every request to the database, as before leases).
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection

from metering import Meter
from metering.middleware import MeteringMiddleware, authenticated_user, client_ip


class BearerNames(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        scheme, _, name = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not name:
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(name)


app = FastAPI()


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"hello": "world"}


mode = os.environ.get("METERING_BENCH_MODE", "none")
leases = os.environ.get("METERING_BENCH_LEASES", "1") == "1"
if mode != "none":
    meter = Meter()  # METERING_DATABASE_URL
    if mode == "stacked":
        app.add_middleware(
            MeteringMiddleware,
            meter=meter,
            limit="per_user",
            key=authenticated_user,
            leases=leases,
        )
        app.add_middleware(AuthenticationMiddleware, backend=BearerNames())
    app.add_middleware(
        MeteringMiddleware,
        meter=meter,
        limit="per_ip",
        key=client_ip(trusted_proxies=["127.0.0.1"]),  # the load generator says who it is
        stacking=mode == "stacked",
        leases=leases,
    )
