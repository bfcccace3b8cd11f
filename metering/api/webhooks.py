"""Webhook management over HTTP: the operations of ``metering webhooks``.

* ``POST /v1/webhooks/endpoints`` adds an endpoint and answers its secret,
  that once; ``GET`` lists them, ``GET /v1/webhooks/endpoints/{id}`` shows
  one, ``PATCH`` changes its URL or types, ``DELETE`` removes it with its
  deliveries;
* ``POST .../{id}/enable`` and ``/disable``; ``POST .../{id}/rotate`` gives it
  a new secret (answered that once; the old one signs for the grace);
  ``POST .../{id}/test`` sends a signed ``webhook.test`` ping now (at most
  `metering.api.context.MAX_TEST_PINGS` at once per process, off the shared threads; 429 beyond);
* ``GET /v1/webhooks/deliveries`` lists deliveries with their attempts;
  ``POST /v1/webhooks/deliveries/replay`` sends deliveries again.

Secrets are never answered but by the add and the rotation that make them:
endpoints show them masked (``secret_masked``), and a password in a URL as
``***``. Every route takes the ``admin`` scope: endpoints and deliveries are
the operator's configuration, and a test ping sends a request out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import (
    bad_field,
    fields_named,
    json_body,
    moment,
    problem_schema,
    problem_with,
    read_object,
    threaded,
)
from metering.api.context import ApiContext, Context
from metering.api.models import body_fields, iso
from metering.api.routes import route
from metering.domain.bounds import MAX_ROW_ID
from metering.domain.instants import from_us
from metering.domain.notifications import NoticeType
from metering.storage.webhooks import AttemptRecord, DeliveryRecord
from metering.webhooks.endpoints import MAX_GRACE_SECONDS, MAX_URL_CHARS, Endpoint, Webhooks

# An endpoint id is printable with no spaces (``ep_`` and hex when made by add).
ENDPOINT_ID_PATTERN = r"^[!-~]{1,64}$"
MessageType = NoticeType  # every type a webhook message can have
DeliveryStatusName = Literal["pending", "delivered", "failed"]


class EndpointIn(BaseModel):
    """A new webhook endpoint."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=1,
        max_length=MAX_URL_CHARS,
        pattern=r"^https?://[^\s/?#@]+",
        examples=["https://billing.example.com/hooks"],
    )
    types: list[MessageType] = Field(default=[], description="Message types to send; [] is all.")
    secret: str | None = Field(
        default=None,
        pattern=r"^(whsec_)?[A-Za-z0-9+/]+={0,2}$",
        description="whsec_ + base64 of 16 to 64 bytes; generated when not given.",
    )


class EndpointChange(BaseModel):
    """What to change of an endpoint; what is not given stays."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        default=None, min_length=1, max_length=MAX_URL_CHARS, pattern=r"^https?://[^\s/?#@]+"
    )
    types: list[MessageType] | None = Field(default=None, description="[] is every type.")


class RotateIn(BaseModel):
    """A secret rotation: the old secret still signs during the grace."""

    model_config = ConfigDict(extra="forbid")

    secret: str | None = Field(default=None, pattern=r"^(whsec_)?[A-Za-z0-9+/]+={0,2}$")
    grace_seconds: float | None = Field(
        default=None,
        ge=0,
        le=MAX_GRACE_SECONDS,
        description="Default METERING_WEBHOOKS_ROTATION_GRACE (86400).",
    )


class EndpointOut(BaseModel):
    """An endpoint: its secret masked, a password in its URL masked."""

    id: str
    url: str
    types: list[MessageType] = Field(description="[] is every type.")
    enabled: bool
    disabled_reason: str | None
    secret_masked: str = Field(examples=["whsec_…k1Q="])
    secret_encrypted: bool = Field(description="Stored encrypted (METERING_SECRET_KEY).")
    rotating_until: datetime | None = Field(description="Until then the old secret signs too.")
    created_at: datetime


class EndpointCreated(BaseModel):
    """A new endpoint, and its secret: shown this once."""

    endpoint: EndpointOut
    secret: str = Field(description="The full signing secret; never shown again.")
    warnings: list[str] = Field(
        description="What will keep deliveries from arriving: a URL whose host is not "
        "public is refused unless the workers allow it (METERING_WEBHOOKS_ALLOW_PRIVATE "
        "or METERING_WEBHOOKS_ALLOW_NETWORKS)."
    )


class SecretRotated(BaseModel):
    """The endpoint's new secret: shown this once."""

    endpoint: EndpointOut
    secret: str = Field(description="The new signing secret; never shown again.")


class Endpoints(BaseModel):
    endpoints: list[EndpointOut] = Field(description="Oldest first.")


class AttemptOut(BaseModel):
    attempt: int
    at: datetime
    status_code: int | None
    duration_ms: int
    error: str | None


class DeliveryOut(BaseModel):
    """A message's delivery to one endpoint, with its attempts."""

    id: int
    message_id: str
    type: str = Field(examples=["limit.denied"])
    endpoint_id: str
    status: DeliveryStatusName
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: datetime | None = Field(description="When pending: the next attempt.")
    created_at: datetime
    attempt_log: list[AttemptOut]


class Deliveries(BaseModel):
    deliveries: list[DeliveryOut] = Field(description="Newest first.")


class ReplayIn(BaseModel):
    """Deliveries to send again: by id, or every one created since (or both)."""

    model_config = ConfigDict(extra="forbid")

    delivery_ids: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        json_schema_extra={"items": {"type": "integer", "minimum": 1, "maximum": MAX_ROW_ID}},
    )
    since: datetime | None = Field(default=None, description="RFC 3339; naive is UTC.")


class Replayed(BaseModel):
    queued: int = Field(description="Deliveries due again now, with a fresh retry schedule.")


def endpoint_json(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "id": endpoint.id,
        "url": endpoint.url,
        "types": list(endpoint.types),
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "secret_masked": endpoint.secret_masked,
        "secret_encrypted": endpoint.secret_encrypted,
        "rotating_until": iso(endpoint.rotating_until),
        "created_at": endpoint.created_at.isoformat(),
    }


def _iso_us(us: int) -> str:
    return from_us(us).isoformat()


def delivery_json(record: DeliveryRecord, attempts: list[AttemptRecord]) -> dict[str, Any]:
    pending = record.status == "pending" and record.next_attempt_at_us is not None
    return {
        "id": record.id,
        "message_id": record.message_id,
        "type": record.message_type,
        "endpoint_id": record.endpoint_id,
        "status": str(record.status),
        "attempts": record.attempts,
        "last_status_code": record.last_status_code,
        "last_error": record.last_error,
        "next_attempt_at": _iso_us(record.next_attempt_at_us)
        if pending and record.next_attempt_at_us is not None
        else None,
        "created_at": _iso_us(record.created_at_us),
        "attempt_log": [
            {
                "attempt": a.attempt,
                "at": _iso_us(a.attempted_at_us),
                "status_code": a.status_code,
                "duration_ms": a.duration_ms,
                "error": a.error,
            }
            for a in attempts
        ],
    }


# -- the routes ---------------------------------------------------------------------

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

# A listing answers at most this many deliveries; a replay takes at most this many ids.
MAX_LISTED: Final = 1000
MAX_REPLAYED: Final = 1000
ENDPOINT_FIELDS: Final = body_fields(EndpointIn)
CHANGE_FIELDS: Final = body_fields(EndpointChange)
ROTATE_FIELDS: Final = body_fields(RotateIn)
REPLAY_FIELDS: Final = body_fields(ReplayIn)

EndpointId = Annotated[
    str,
    Path(
        pattern=ENDPOINT_ID_PATTERN,
        description="The endpoint's id.",
        examples=["ep_3f9c2a1b7d4e5f60"],
    ),
]

MISSING_404: Final = problem_schema(
    "Not found: the ids that name no delivery (the others were queued again).",
    delivery_ids={"type": "array", "items": {"type": "integer"}},
)


def _hooks(context: ApiContext) -> Webhooks:
    """The library's webhook management, with the server's delivery settings
    (``METERING_WEBHOOKS_*``: a test ping's timeout and allowed destinations)."""
    return Webhooks(context.meter, context.settings.delivery)


def _text(value: object, pointer: str) -> str:
    if not isinstance(value, str):
        raise bad_field(pointer, "must be a string")
    return value


def _secret(value: object) -> str | None:
    """A secret given, or None: generated then (an empty one is a mistake, not that)."""
    if value is None:
        return None
    if _text(value, "secret") == "":
        raise bad_field("secret", "must not be empty: leave it out to have one generated")
    return str(value)


def _types(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise bad_field("types", "must be an array of message types ([] is every type)")
    return value


# -- endpoints ---------------------------------------------------------------------


@route(
    router.post,
    "/endpoints",
    "Add an endpoint",
    scope="admin",
    ok={201: {"model": EndpointCreated, "description": "Added; its secret, shown this once."}},
    errors=(400, 415),
    status_code=201,
    openapi_extra=json_body(EndpointIn),
)
async def add_endpoint(request: Request, context: Context) -> Response:
    """Add an enabled endpoint for ``types`` (default: every type). The answer
    holds its signing secret, given or generated: store it now, no later
    answer shows it. It is stored encrypted when the server has
    ``METERING_SECRET_KEY`` (``secret_encrypted``), in plaintext otherwise.
    ``warnings`` says when deliveries to the URL will be refused (its host is
    not public) and which setting allows them."""
    fields = await read_object(request, ENDPOINT_FIELDS)
    if "url" not in fields:
        raise bad_field("url", "is required")
    url = _text(fields["url"], "url")
    types = _types(fields.get("types", []))
    secret = _secret(fields.get("secret"))
    hooks = _hooks(context)
    endpoint, full_secret = await threaded(hooks.add, url, secret=secret, types=types)
    refused = await threaded(hooks.destination_warning, url)
    body = {
        "endpoint": endpoint_json(endpoint),
        "secret": full_secret,
        "warnings": [] if refused is None else [refused],
    }
    return JSONResponse(body, status_code=201)


@route(
    router.get,
    "/endpoints",
    "Every endpoint",
    scope="admin",
    ok={200: {"model": Endpoints, "description": "Oldest first, secrets masked."}},
)
async def list_endpoints(context: Context) -> Response:
    """Every endpoint, oldest first, secrets masked (``metering webhooks list``)."""
    found = await threaded(_hooks(context).endpoints)
    return JSONResponse({"endpoints": [endpoint_json(e) for e in found]})


@route(
    router.get,
    "/endpoints/{endpoint_id}",
    "An endpoint",
    scope="admin",
    ok={200: {"model": EndpointOut, "description": "The endpoint, its secret masked."}},
    errors=(400, 404),
)
async def get_endpoint(endpoint_id: EndpointId, context: Context) -> Response:
    """One endpoint, its secret masked; 404 when no endpoint has this id."""
    return JSONResponse(endpoint_json(await threaded(_hooks(context).get, endpoint_id)))


@route(
    router.patch,
    "/endpoints/{endpoint_id}",
    "Change an endpoint's URL or types",
    scope="admin",
    ok={200: {"model": EndpointOut, "description": "The endpoint as it is now."}},
    errors=(400, 404, 415),
    openapi_extra=json_body(EndpointChange),
)
async def change_endpoint(endpoint_id: EndpointId, request: Request, context: Context) -> Response:
    """Send to another ``url`` and/or other ``types`` ([] is every type); what
    is not given stays. Deliveries already queued go to the new URL."""
    fields = await read_object(request, CHANGE_FIELDS)
    url = _text(fields["url"], "url") if "url" in fields else None
    types = _types(fields["types"]) if "types" in fields else None
    endpoint = await threaded(_hooks(context).update, endpoint_id, url=url, types=types)
    return JSONResponse(endpoint_json(endpoint))


@route(
    router.delete,
    "/endpoints/{endpoint_id}",
    "Remove an endpoint",
    scope="admin",
    ok={204: {"description": "Removed, with its deliveries and their attempts."}},
    errors=(400, 404),
    status_code=204,
)
async def remove_endpoint(endpoint_id: EndpointId, context: Context) -> Response:
    """Remove an endpoint with its deliveries (``metering webhooks remove``)."""
    await threaded(_hooks(context).remove, endpoint_id)
    return Response(status_code=204)


async def _set_enabled(context: ApiContext, endpoint_id: str, enabled: bool) -> Response:
    hooks = _hooks(context)
    await threaded(hooks.set_enabled, endpoint_id, enabled)
    return JSONResponse(endpoint_json(await threaded(hooks.get, endpoint_id)))


ENABLED: Final = {200: {"model": EndpointOut, "description": "The endpoint as it is now."}}


@route(
    router.post,
    "/endpoints/{endpoint_id}/enable",
    "Send to an endpoint again",
    scope="admin",
    ok=ENABLED,
    errors=(400, 404),
)
async def enable_endpoint(endpoint_id: EndpointId, context: Context) -> Response:
    """Enable an endpoint: the deliveries that waited go out."""
    return await _set_enabled(context, endpoint_id, True)


@route(
    router.post,
    "/endpoints/{endpoint_id}/disable",
    "Stop sending to an endpoint",
    scope="admin",
    ok=ENABLED,
    errors=(400, 404),
)
async def disable_endpoint(endpoint_id: EndpointId, context: Context) -> Response:
    """Disable an endpoint: nothing is sent; its deliveries wait."""
    return await _set_enabled(context, endpoint_id, False)


@route(
    router.post,
    "/endpoints/{endpoint_id}/rotate",
    "Give an endpoint a new secret",
    scope="admin",
    ok={200: {"model": SecretRotated, "description": "The new secret, shown this once."}},
    errors=(400, 404, 415),
    openapi_extra=json_body(RotateIn, required=False),
)
async def rotate_secret(endpoint_id: EndpointId, request: Request, context: Context) -> Response:
    """A new signing secret (``secret``, or generated), answered this once; the
    old one still signs for ``grace_seconds`` (default 24 h), so receivers can
    switch without losing a message. The body is optional."""
    fields = await read_object(request, ROTATE_FIELDS, optional=True)
    secret = _secret(fields.get("secret"))
    grace = fields.get("grace_seconds")
    hooks = _hooks(context)
    new_secret = await threaded(hooks.rotate, endpoint_id, secret=secret, grace_seconds=grace)
    endpoint = await threaded(hooks.get, endpoint_id)
    return JSONResponse({"endpoint": endpoint_json(endpoint), "secret": new_secret})


@route(
    router.post,
    "/endpoints/{endpoint_id}/test",
    "Send a test ping",
    scope="admin",
    ok={
        200: {
            "model": DeliveryOut,
            "description": "The ping's delivery: delivered, or failed with why.",
        }
    },
    errors=(400, 404),
)
async def ping_endpoint(endpoint_id: EndpointId, context: Context) -> Response:
    """Send a signed ``webhook.test`` ping now, once (no retries), and answer
    its delivery: ``status`` delivered when the endpoint answered 2xx, failed
    otherwise (``last_status_code``, ``last_error``). A disabled endpoint is
    pinged too. The request waits for the endpoint (its delivery timeout).

    Pings run on a few threads of their own (`metering.api.context.MAX_TEST_PINGS` per server
    process), so slow receivers never hold the threads other routes need;
    beyond that the answer is 429 with ``Retry-After``."""
    hooks = _hooks(context)
    with fields_named():
        record, attempts = await context.pings.run(hooks.send_test, endpoint_id)
    return JSONResponse(delivery_json(record, attempts))


# -- deliveries --------------------------------------------------------------------


@route(
    router.get,
    "/deliveries",
    "Deliveries and their attempts",
    scope="admin",
    ok={200: {"model": Deliveries, "description": "Newest first."}},
    errors=(400,),
)
async def list_deliveries(
    context: Context,
    status: Annotated[DeliveryStatusName | None, Query(description="Only this status.")] = None,
    endpoint_id: Annotated[str | None, Query(description="Only to this endpoint.")] = None,
    count: Annotated[int, Query(ge=1, le=MAX_LISTED, description="How many, newest first.")] = 50,
) -> Response:
    """The ``count`` newest deliveries (at most 1000), each with its attempts:
    ``metering webhooks deliveries``."""
    hooks = _hooks(context)

    def read() -> list[dict[str, Any]]:
        found = hooks.deliveries(status=status, endpoint_id=endpoint_id, count=count)
        return [delivery_json(d, hooks.attempts(d.id)) for d in found]

    return JSONResponse({"deliveries": await threaded(read)})


@route(
    router.post,
    "/deliveries/replay",
    "Send deliveries again",
    scope="admin",
    ok={200: {"model": Replayed, "description": "How many are due again."}},
    errors=(400, 415),
    more={404: MISSING_404},
    openapi_extra=json_body(ReplayIn),
)
async def replay(request: Request, context: Context) -> Response:
    """Send deliveries again, failed or not, due now with a fresh retry
    schedule: by ``delivery_ids``, or every one created ``since``, or those of
    the ids created since. As the CLI: an id that names no delivery (or none
    created since) is a 404 listing them (``delivery_ids``); the others given
    are queued again all the same."""
    fields = await read_object(request, REPLAY_FIELDS)
    ids = _delivery_ids(fields.get("delivery_ids"))
    since = moment(fields.get("since"), "since")
    if not ids and since is None:
        raise bad_field("delivery_ids", "give delivery_ids, since, or both")
    hooks = _hooks(context)
    if not ids:
        return JSONResponse({"queued": await threaded(hooks.replay, [], since=since)})

    def each() -> list[int]:
        # One at a time, as the CLI: a count per id says which ids name no delivery.
        return [i for i in ids if hooks.replay([i], since=since) == 0]

    missing = await threaded(each)
    if missing:
        done = len(ids) - len(missing)
        detail = f"no delivery {', '.join(map(str, missing))}"
        if since is not None:
            detail += f" created since {since.isoformat()}"
        detail += f"; {done} of {len(ids)} queued again"
        return problem_with("not-found", detail, delivery_ids=missing)
    return JSONResponse({"queued": len(ids)})


def _delivery_ids(value: object) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise bad_field("delivery_ids", "must be a non-empty array of delivery ids")
    if len(value) > MAX_REPLAYED:
        raise bad_field("delivery_ids", f"at most {MAX_REPLAYED} ids in one request")
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= MAX_ROW_ID:
            raise bad_field(f"delivery_ids[{index}]", f"must be a whole number, 1 to {MAX_ROW_ID}")
    return list(dict.fromkeys(value))
