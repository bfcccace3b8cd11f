"""`create_api`: the HTTP API as one FastAPI application.

Routers come from one module each (`metering.api.events`,
`metering.api.decisions` ...); errors become problem details in one place
(`metering.api.problems`); request bodies are bounded while they are read
(`metering.api.bounds`); every route asks `metering.api.auth.require_scope`,
and each API key's requests are metered (`metering.api.ratelimit`).
``metering serve`` runs it under uvicorn (``create_api`` is the factory).
``/docs`` and ``/redoc`` load nothing from another host (`metering.api.apidocs`);
the schema declares the bearer scheme and each operation's scope.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from metering.api import admin, decisions, events, history, portal
from metering.api.apidocs import install_docs
from metering.api.auth import (
    BEARER,
    ApiKeyAuthentication,
    Authenticator,
    require_scope,
    security_scheme,
)
from metering.api.bounds import BodyLimit, Utf8Target
from metering.api.context import ApiContext, IsQueued, broker_lookup
from metering.api.models import REQUEST_MODELS
from metering.api.problems import Problem, install_problem_handlers
from metering.api.queueing import ApiProducer
from metering.api.ratelimit import PerKeyRate, define_rate_limit
from metering.apikeys import ApiKeys
from metering.meter import Meter
from metering.pipeline.producer import UsageProducer
from metering.settings import Settings
from metering.telemetry.lag import lag_collector
from metering.telemetry.metrics import instrument_app
from metering.telemetry.tracing import setup_tracing

# Each module's router, in the order of the docs. Admin routes (limits,
# reservations, reports, webhooks) join this tuple.
ROUTERS: tuple[APIRouter, ...] = (
    events.router,
    decisions.router,
    history.router,
    portal.router,
    *admin.ROUTERS,
)

log = logging.getLogger("metering.api")
# Ids this process could not send to the broker before it stopped
# (`unsent_at_shutdown`: ``metering serve`` then exits non-zero).
_unsent: list[str] = []
OPEN_WARNING = (
    "no API key exists: the API answers every request; create one with "
    "`metering apikeys create --scope ...` (or set METERING_API_AUTH=required)"
)

DESCRIPTION = """\
Usage events in (plain JSON or CloudEvents 1.0), decisions and usage out.
Every error is an RFC 9457 problem (`application/problem+json`).
Authenticate with `Authorization: Bearer <API key>` (`metering apikeys create`);
each key's requests are rate limited (429).
See docs/api-http.md.
"""


def create_api(
    settings: Settings | None = None,
    *,
    meter: Meter | None = None,
    producer: UsageProducer | None = None,
    is_queued: IsQueued | None = None,
) -> FastAPI:
    """The API on ``settings`` (default: ``Settings.from_env()``).

    A ``meter`` or ``producer`` given is used as is and left open at
    shutdown; those the API makes itself (on ``settings.database_url`` and
    ``settings.broker_url``) are opened at startup and closed at shutdown.
    ``is_queued`` answers whether an undecided event id is on the queue
    (``pending``); by default the broker is asked.
    """
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_meter = meter or Meter(
            settings.database_url, correction_horizon_days=settings.correction_horizon_days
        )
        own_producer = producer or ApiProducer(
            settings.broker_url,
            queues=settings.queues,
            retry_backoff_seconds=settings.api_retry_backoff_seconds,
        )
        lookup = is_queued or broker_lookup(settings.broker_url)
        app.state.metering = ApiContext(settings, own_meter, own_producer, lookup)
        app.state.auth = Authenticator(ApiKeys(own_meter), settings.api_auth)
        define_rate_limit(own_meter, settings.api_rate)
        if not app.state.auth.required():
            log.warning(OPEN_WARNING)
        try:
            yield
        finally:
            app.state.metering.close()
            if isinstance(own_producer, ApiProducer) and producer is None:
                _shut_down(own_producer)
            if meter is None:
                own_meter.close()

    app = FastAPI(
        title="metering",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    install_docs(app)
    for router in ROUTERS:
        app.include_router(router)
    install_problem_handlers(app)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.api_max_body_bytes,
        timeout_seconds=settings.api_body_timeout_seconds,
    )
    app.add_middleware(Utf8Target)
    # Starlette runs the middleware added last outermost: keys are looked up
    # before the per-key rate charges them.
    app.add_middleware(PerKeyRate, rate=settings.api_rate)
    app.add_middleware(ApiKeyAuthentication)
    # GET /metrics (out of the schema, with the lag gauges) and request counts;
    # last, so the requests BodyLimit answers are counted too. Open unless
    # METERING_METRICS_SCOPE asks for a key (even while the API is open).
    lag = lag_collector(settings.database_url, settings.broker_url, settings.queues)
    scope = settings.metrics_scope
    guard = [] if scope is None else [require_scope(scope, always=True)]
    instrument_app(app, collectors=[lag], dependencies=guard)
    if settings.tracing:
        setup_tracing("metering-api", app=app, env=dict(settings.otel))
    _with_request_schemas(app, (*REQUEST_MODELS, Problem))
    return app


def _shut_down(producer: ApiProducer) -> None:
    """Close the API's producer; the events it still keeps (the broker is
    down) are named in one line, and remembered for `unsent_at_shutdown`."""
    unsent = producer.shut_down()
    if unsent:
        _unsent.extend(unsent)
        log.error(
            "%d event(s) kept while the broker was unavailable were not sent before shutdown "
            "and are dropped: %s (their clients must send them again, under the same ids)",
            len(unsent),
            ", ".join(unsent),
        )


def unsent_at_shutdown() -> list[str]:
    """Ids of events an API of this process accepted, kept while the broker was
    unavailable and could not send before it stopped."""
    return list(_unsent)


def _version() -> str:
    try:
        return version("metering")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"


def _with_request_schemas(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Add the bodies the routes read by hand to the schema's components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                openapi_version=app.openapi_version,
                description=app.description,
                routes=app.routes,
            )
            schema.setdefault("components", {})["securitySchemes"] = {BEARER: security_scheme()}
            components = schema["components"].setdefault("schemas", {})
            for model in models:
                found = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(found.pop("$defs", {}))
                components.setdefault(model.__name__, found)
            _without_fastapi_422(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _without_fastapi_422(schema: dict[str, Any]) -> None:
    """FastAPI documents its own 422 validation error; this API answers a 400 problem."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            answers = operation.get("responses", {})
            content = answers.get("422", {}).get("content", {})
            if "HTTPValidationError" in str(content.get("application/json", "")):
                del answers["422"]
    for name in ("HTTPValidationError", "ValidationError"):
        schema["components"]["schemas"].pop(name, None)
