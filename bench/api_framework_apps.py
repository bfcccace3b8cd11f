"""The two minimal ``POST /v1/events`` apps `bench_api.py --framework` compares.

``METERING_BENCH_FRAMEWORK``: ``fastapi`` (a pydantic model per event, then
the library's `make_event`) or ``starlette`` (the raw body, ``json.loads``,
then `make_event`). Neither queues anything: this measures the framework's
share of a 100-event request, not the broker's. ``fastapi-raw``: FastAPI
routing with the Starlette app's hand-read body, as `metering.api` does. ``bare``: FastAPI with
``POST /v1/check`` answering a constant, the peer of the real ``/v1/check``.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from metering.domain.events import make_event
from metering.errors import InvalidInput


class PlainEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_id: StrictStr | None = None
    subject: StrictStr
    limit: StrictStr
    cost: StrictInt = 1
    occurred_at: datetime | None = None
    metadata: dict[str, Any] | None = None


def fastapi_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/events", status_code=202)
    async def post_events(events: list[PlainEvent]) -> dict[str, Any]:
        now = datetime.now(UTC)
        ids = [
            make_event(
                [(e.subject, e.limit, e.cost)], e.occurred_at or now, e.event_id, e.metadata
            ).event_id
            for e in events
        ]
        return {"accepted": ids}

    return app


def fastapi_raw_app() -> FastAPI:
    """FastAPI routing, the body read by hand: what `metering.api` does."""
    app = FastAPI()
    app.add_api_route("/v1/events", _post_events, methods=["POST"], status_code=202)
    return app


async def _post_events(request: Request) -> Response:
    items = json.loads(await request.body())
    now = datetime.now(UTC)
    ids = []
    try:
        for item in items:
            at = item.get("occurred_at")
            when = datetime.fromisoformat(at) if at else now
            charge = (item.get("subject"), item.get("limit"), item.get("cost", 1))
            event = make_event([charge], when, item.get("event_id"), item.get("metadata"))
            ids.append(event.event_id)
    except InvalidInput as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    return JSONResponse({"accepted": ids}, status_code=202)


def starlette_app() -> Starlette:
    return Starlette(routes=[Route("/v1/events", _post_events, methods=["POST"])])


def bare_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/check")
    async def check() -> dict[str, Any]:
        return {"allowed": True, "remaining": 4}

    return app


_APPS = {
    "fastapi": fastapi_app,
    "fastapi-raw": fastapi_raw_app,
    "starlette": starlette_app,
    "bare": bare_app,
}
app = _APPS[os.environ.get("METERING_BENCH_FRAMEWORK", "fastapi")]()
