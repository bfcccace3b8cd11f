"""Floating licenses over HTTP: ``POST /v1/checkouts``, ``GET /v1/checkouts``,
``GET /v1/checkouts/{id}``, ``DELETE /v1/checkouts/{id}`` (check in) and
``POST /v1/checkouts/{id}/renew``.

A checkout is `Meter.checkout`: units of a concurrent limit held until
checked in or past their time to live. Checking out, in and renewing are
what a service does around the work it licenses, so they take the
``ingest`` scope (as reservations); listing and reading take ``read``. An
ingest key's answers leave out the figures (``held``, ``maximum``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import (
    invalid,
    json_body,
    listed,
    problem_schema,
    problem_with,
    read_object,
)
from metering.api.auth import may_read, scoped_subject
from metering.api.context import ApiContext, Context
from metering.api.models import EVENT_ID_PATTERN, LIMIT_PATTERN, body_fields, subject_field
from metering.api.parsing import whole_number
from metering.api.problems import PROBLEM_JSON
from metering.api.routes import route
from metering.domain.events import MAX_COST
from metering.domain.licenses import DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS
from metering.errors import CheckoutReleased, InvalidInput, UnknownCheckout
from metering.licenses import Checkout


class CheckoutIn(BaseModel):
    """Check out ``cost`` units of a concurrent limit for a subject."""

    model_config = ConfigDict(extra="forbid")

    checkout_id: str | None = Field(
        default=None,
        pattern=EVENT_ID_PATTERN,
        description="The checkout's id: a repeated id answers the same checkout. "
        "Generated when not given.",
    )
    subject: str = subject_field()
    limit: str = Field(pattern=LIMIT_PATTERN, examples=["cad"])
    cost: int = Field(default=1, ge=1, le=MAX_COST)
    ttl_seconds: float = Field(
        default=DEFAULT_TTL_SECONDS,
        gt=0,
        le=MAX_TTL_SECONDS,
        description="Seconds it is held unless checked in or renewed (at most 7 days).",
    )


class CheckoutOut(BaseModel):
    """A checkout as decided or as stored."""

    id: str
    subject: str
    limit: str
    cost: int
    allowed: bool
    state: Literal["held", "released", "denied"] = Field(
        description="held; released (checked in, or expired); denied (nothing stored)."
    )
    held: int | None = Field(description="Units the subject holds after this decision.")
    maximum: int | None
    created_at: datetime
    expires_at: datetime | None
    released_at: datetime | None
    released_by: Literal["checkin", "expiry"] | None
    retry_at: datetime | None = Field(
        description="Denied: when it would fit if nothing were checked in."
    )


class CheckedIn(CheckoutOut):
    returned: int = Field(
        description="Units given back by this call: 0 on a second checkin "
        "or after the checkout expired (it came back then)."
    )


class Checkouts(BaseModel):
    checkouts: list[CheckoutOut] = Field(description="Newest first.")


router = APIRouter(prefix="/v1", tags=["licenses"])

MAX_LISTED: Final = 1000
CHECKOUT_FIELDS: Final = body_fields(CheckoutIn)
ID_NAMES: Final = {"checkout_id": "checkout_id"}
# The members of a ``checkout-released`` problem: which checkout ended, how and when.
ENDED: Final[dict[str, dict[str, Any]]] = {
    "checkout_id": {"type": "string"},
    "released_by": {"type": "string", "enum": ["checkin", "expiry"]},
    "released_at": {"type": "string", "format": "date-time"},
}
RELEASED_409: Final = problem_schema(
    "checkout-released: the checkout was checked in or has expired; check out again "
    "under a new checkout id.",
    **ENDED,
)
CHECKOUT_409: Final = problem_schema(
    "checkout-released (with checkout_id, released_by, released_at): this checkout id "
    "has ended (checked in, or expired) and holds nothing; check out again under a new "
    "checkout id. checkout-conflict: the id was used with another subject, limit or cost.",
    **ENDED,
)
# checkout-conflict carries none of them: documented there, required under renew only.
CHECKOUT_409["content"][PROBLEM_JSON]["schema"]["allOf"][1]["required"] = []

CheckoutId = Annotated[
    str, Path(pattern=EVENT_ID_PATTERN, description="The checkout's id.", examples=["co_1"])
]


def _json(found: Checkout, figures: bool) -> dict[str, Any]:
    body = found.to_dict()
    if not figures:
        body["held"] = body["maximum"] = None
    return body


@route(
    router.post,
    "/checkouts",
    "Check out a floating license",
    scope="ingest",
    ok={200: {"model": CheckoutOut, "description": "Held (allowed), or denied."}},
    errors=(400, 415, 422),
    more={409: CHECKOUT_409},
    openapi_extra=json_body(CheckoutIn),
)
async def checkout(request: Request, context: Context) -> Response:
    """Hold ``cost`` units of a concurrent limit until ``DELETE`` checks them in
    or ``ttl_seconds`` pass; denied (nothing stored, ``retry_at``) when the
    subject already holds its maximum. A windowed limit is a 400. A retry
    (the same ``checkout_id``) answers the checkout while it is held, and 409
    ``checkout-released`` once it has ended."""
    item = await read_object(request, CHECKOUT_FIELDS)
    for name in ("subject", "limit"):
        if name not in item:
            raise invalid(InvalidInput(name, "is required"))
    cost: Any = whole_number(item.get("cost", 1))  # checked by the library, as every field
    ttl = item.get("ttl_seconds", DEFAULT_TTL_SECONDS)
    try:
        found = await run_in_threadpool(
            lambda: context.meter.checkout(
                item["subject"],
                item["limit"],
                cost,
                ttl_seconds=ttl,
                checkout_id=item.get("checkout_id"),
            )
        )
    except CheckoutReleased as exc:
        return _ended(exc)
    return JSONResponse(_json(found, await may_read(request)))


def _ended(exc: CheckoutReleased) -> Response:
    """409 ``checkout-released``, naming the checkout, how and when it ended."""
    at = exc.released_at.isoformat().replace("+00:00", "Z")
    members = {"checkout_id": exc.checkout_id, "released_by": exc.released_by}
    return problem_with("checkout-released", str(exc), **members, released_at=at)


@route(
    router.get,
    "/checkouts",
    "The newest checkouts",
    scope="read",
    subjects="query",
    ok={200: {"model": Checkouts}},
    errors=(400,),
)
async def list_checkouts(
    request: Request,
    context: Context,
    subject: Annotated[str | None, Query(description="Only this subject's.")] = None,
    limit: Annotated[str | None, Query(description="Only this limit's.")] = None,
    state: Annotated[
        Literal["held", "released"] | None,
        Query(description="As it stands now: an expired checkout is released, swept or not."),
    ] = None,
    count: Annotated[int, Query(ge=1, le=MAX_LISTED, description="How many, newest first.")] = 100,
) -> Response:
    """What ``metering checkout list`` shows (an expired checkout is released);
    a customer's key gets its own subject's."""
    subject = await scoped_subject(request, subject)
    return await listed("checkouts", context.meter.checkouts, subject, limit, state, count)


async def _stored(context: ApiContext, checkout_id: str) -> Checkout:
    found = await run_in_threadpool(context.meter.checkout_info, checkout_id)
    if found is None:
        raise UnknownCheckout(checkout_id)
    return found


@route(
    router.get,
    "/checkouts/{checkout_id}",
    "A checkout",
    scope="read",
    ok={200: {"model": CheckoutOut}},
    errors=(400, 404),
)
async def get_checkout(checkout_id: CheckoutId, context: Context) -> Response:
    """A stored checkout; 404 for an id never checked out (a denial stores nothing)."""
    return JSONResponse((await _stored(context, checkout_id)).to_dict())


@route(
    router.delete,
    "/checkouts/{checkout_id}",
    "Check in: give the license back",
    scope="ingest",
    ok={200: {"model": CheckedIn, "description": "Released (a second checkin gives back 0)."}},
    errors=(400, 404),
)
async def checkin(request: Request, checkout_id: CheckoutId, context: Context) -> Response:
    """Give a held checkout back once (``returned``: its cost); again, or after
    it expired, ``returned`` is 0 and nothing changes."""
    returned = await run_in_threadpool(context.meter.checkin, checkout_id)
    found = await _stored(context, checkout_id)
    return JSONResponse({**_json(found, await may_read(request)), "returned": returned})


@route(
    router.post,
    "/checkouts/{checkout_id}/renew",
    "Renew: hold a checkout longer",
    scope="ingest",
    ok={200: {"model": CheckoutOut}, 409: RELEASED_409},
    errors=(400, 404),
)
async def renew(
    checkout_id: CheckoutId,
    context: Context,
    ttl_seconds: Annotated[
        float | None,
        Query(gt=0, le=MAX_TTL_SECONDS, description="Held this long from now; default: its own."),
    ] = None,
) -> Response:
    """Move a held checkout's expiry to ``ttl_seconds`` from now (never earlier);
    409 ``checkout-released`` once it was checked in or has expired."""
    try:
        renewed = await run_in_threadpool(context.meter.renew, checkout_id, ttl_seconds)
    except CheckoutReleased as exc:
        return _ended(exc)
    return JSONResponse(renewed.to_dict())
