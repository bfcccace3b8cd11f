"""Entitlements, grants and corrections over HTTP.

``PUT``, ``DELETE /v1/entitlements/{subject}/{limit}`` and ``GET
/v1/entitlements``; ``POST``, ``GET /v1/grants``; ``POST
/v1/events/{event_id}/void`` and ``GET /v1/corrections``. Each is one call
of `Meter` (`set_entitlement`, `grant`, `void` ...), whose rules check every
value: a bad one is a 400 naming its field, and nothing is stored. Changing
them takes the ``admin`` scope (they change what subjects may use, and what
is billed); reading them ``read``.

A grant and a void are idempotent by their ids: a new one answers 201, the
same one again 200 with ``duplicate``, an id reused for something else 409.
A subject, and an event id, may hold ``/``: the path takes it whole.

The bodies and answers are declared here as pydantic models (the schema's
source, and the fields the hand parser lets through). Answers are the
library's ``to_dict`` (`Entitlement`, `Grant`, `Correction`), so the CLI's
``--format json`` and the API agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.allowances import RecurringGrant
from metering.api.admin_common import (
    LIMIT_NAMES,
    bad_field,
    fields_named,
    json_body,
    listed,
    moment,
    read_object,
    threaded,
)
from metering.api.auth import scoped_subject
from metering.api.context import Context
from metering.api.models import (
    EVENT_ID_PATTERN,
    LIMIT_PATTERN,
    SUBJECT_PATTERN,
    LimitFilter,
    SubjectFilter,
    body_fields,
    record_model,
    subject_field,
)
from metering.api.parsing import whole_number
from metering.api.routes import route
from metering.domain.corrections import MAX_REASON_CHARS
from metering.domain.events import MAX_SUBJECT_LENGTH
from metering.domain.grants import DEFAULT_PRIORITY, MAX_GRANT, MAX_PRIORITY
from metering.domain.limits import MAX_MAXIMUM
from metering.meter import Meter

# A reason is printable text with something besides spaces (ASCII here; the
# library takes any printable text).
REASON_PATTERN: Final = r"^[ -~]*[!-~][ -~]*$"


def _moment(description: str) -> Any:
    return Field(default=None, description=f"{description} RFC 3339; naive is UTC.")


def _reason(description: str) -> Any:
    return Field(
        min_length=1, max_length=MAX_REASON_CHARS, pattern=REASON_PATTERN, description=description
    )


# -- entitlements ------------------------------------------------------------------


class EntitlementIn(BaseModel):
    """A subject's own maximum for a limit, from an instant on."""

    model_config = ConfigDict(extra="forbid")

    maximum: int = Field(ge=1, le=MAX_MAXIMUM, description="Inclusive maximum per period.")
    effective_from: datetime | None = _moment("When it takes effect (default now).")


class EntitlementOut(BaseModel):
    """One change of a subject's maximum; ``maximum`` null: back to the limit's default."""

    subject: str
    limit: str
    maximum: int | None
    effective_from: datetime
    created_at: datetime = Field(description="When the change was recorded.")


class Entitlements(BaseModel):
    entitlements: list[EntitlementOut] = Field(
        description="By limit and subject, oldest change first."
    )


# -- grants ---------------------------------------------------------------------


class GrantIn(BaseModel):
    """A top-up: ``amount`` more on top of the maximum, until ``expires_at``."""

    model_config = ConfigDict(extra="forbid")

    subject: str = subject_field()
    limit: str = Field(pattern=LIMIT_PATTERN, examples=["api_calls"])
    amount: int = Field(ge=1, le=MAX_GRANT)
    expires_at: datetime | None = _moment("When what is left of it is gone (default never).")
    grant_id: str | None = Field(
        default=None,
        pattern=EVENT_ID_PATTERN,
        description="Its idempotency key: the same grant again answers 200, other values "
        "under the same id 409. Generated when not given.",
    )
    effective_from: datetime | None = _moment("When it starts to count (default now).")
    reason: str | None = Field(
        default=None, min_length=1, max_length=MAX_REASON_CHARS, pattern=REASON_PATTERN
    )
    priority: int = Field(
        default=DEFAULT_PRIORITY,
        ge=0,
        le=MAX_PRIORITY,
        description="Grants are drawn by priority (the lowest number first), then the "
        "earliest expiring first.",
    )
    low: int | str | None = Field(
        default=None,
        description="Units (500) or a percentage of the amount ('20%'): when what is left "
        "falls to it, grant.low is sent, once (per issue of a recurring grant).",
        examples=["20%"],
    )
    every: str | None = Field(
        default=None,
        description="Recurring: one issue now, one at each period start (calendar "
        "boundaries on a calendar limit), e.g. '1mo'. No expires_at or effective_from then.",
        examples=["1mo"],
    )
    rollover_max: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GRANT,
        description="With every: up to this much of what the last issue left is added to the "
        "next (default 0).",
    )
    until: datetime | None = _moment("With every: no issue starts at or after it.")


class GrantOut(BaseModel):
    grant_id: str
    subject: str
    limit: str
    amount: int
    used: int
    left: int
    effective_from: datetime
    expires_at: datetime | None
    reason: str | None
    priority: int
    recurring_grant_id: str | None = Field(description="The recurring grant this is an issue of.")
    issue: int | None = Field(description="Which issue of its recurring grant (1 is the first).")
    low_at: int | None = Field(description="What left (or less) sends grant.low.")


RecurringGrantOut = record_model(
    RecurringGrant,
    "RecurringGrantOut",
    next_issue_at="Null: no more issues (until reached).",
)


class RecurringGrants(BaseModel):
    recurring_grants: list[RecurringGrantOut]  # type: ignore[valid-type]


class AlertIn(BaseModel):
    """One subject's own thresholds for a limit, replacing the limit's."""

    model_config = ConfigDict(extra="forbid")

    at: list[int | str] = Field(
        min_length=1,
        description="Percentages of the maximum ('80%') and amounts of usage (5000).",
        examples=[["80%", 5000]],
    )


class AlertOut(BaseModel):
    subject: str
    limit: str
    at: list[str]
    thresholds: list[int]
    thresholds_units: list[int]
    updated_at: datetime


class Alerts(BaseModel):
    alerts: list[AlertOut]


class AlertRemoved(BaseModel):
    subject: str
    limit: str
    removed: bool = Field(description="False: the subject had none of its own; nothing changed.")


class GrantAdded(GrantOut):
    duplicate: bool = Field(description="The grant id existed with these values: nothing changed.")


class Grants(BaseModel):
    grants: list[GrantOut] = Field(description="By subject, limit and id; at most 1000.")


# -- corrections ------------------------------------------------------------------


class VoidIn(BaseModel):
    """Why the event is voided, and optionally the correction's id."""

    model_config = ConfigDict(extra="forbid")

    reason: str = _reason("Kept with the correction.")
    correction_id: str | None = Field(
        default=None,
        pattern=EVENT_ID_PATTERN,
        description="Its idempotency key; generated when not given.",
    )


class GrantGiven(BaseModel):
    grant_id: str
    amount: int


class VoidedCharge(BaseModel):
    subject: str
    limit: str
    cost: int = Field(description="Given back to the counter of its own window.")
    window_start: datetime | None = Field(description="Null for a token bucket.")
    grants: list[GrantGiven] = Field(description="Grants still active that got their amount back.")


class CorrectionOut(BaseModel):
    correction_id: str
    event_id: str
    reason: str
    created_at: datetime
    charges: list[VoidedCharge]


class Voided(CorrectionOut):
    duplicate: bool = Field(description="The event was voided before: that correction.")


class Corrections(BaseModel):
    corrections: list[CorrectionOut] = Field(description="Oldest first.")


# -- the routes ---------------------------------------------------------------------

router = APIRouter(prefix="/v1", tags=["entitlements, grants and corrections"])

ENTITLEMENT_FIELDS: Final = body_fields(EntitlementIn)
GRANT_FIELDS: Final = body_fields(GrantIn)
ALERT_FIELDS: Final = body_fields(AlertIn)
VOID_FIELDS: Final = body_fields(VoidIn)
MAX_CORRECTIONS: Final = 1000

Subject = Annotated[
    str,
    Path(
        description="The subject (it may hold /; URL-encoded).",
        json_schema_extra={"pattern": SUBJECT_PATTERN, "maxLength": MAX_SUBJECT_LENGTH},
    ),
]
LimitName = Annotated[
    str,
    Path(description="The limit's name.", json_schema_extra={"pattern": LIMIT_PATTERN}),
]


def _listing(
    path: str,
    summary: str,
    model: type[BaseModel],
    description: str,
    read: Callable[[Meter, str | None, str | None], Iterable[Any]],
    doc: str | None = None,
    *,
    customers: bool = False,
) -> None:
    """``GET path`` (``read`` scope): what ``read`` finds, of one subject and
    one limit if given, as ``{key: [...]}``, the key the path's last part
    (``/recurring-grants``: ``recurring_grants``); ``doc`` describes it.
    ``customers``: a customer's key lists its own subject's (else 404)."""
    key = path.strip("/").replace("-", "_")

    async def listing(
        request: Request,
        context: Context,
        subject: SubjectFilter = None,
        limit: LimitFilter = None,
    ) -> Response:
        if customers:
            subject = await scoped_subject(request, subject)
        return await listed(key, read, context.meter, subject, limit, names=LIMIT_NAMES)

    listing.__doc__ = doc
    route(
        router.get,
        path,
        summary,
        scope="read",
        subjects="query" if customers else None,
        ok={200: {"model": model, "description": description}},
        errors=(400,),
        name=f"list_{key}",
    )(listing)


# -- entitlements ---------------------------------------------------------------


@route(
    router.put,
    "/entitlements/{subject:path}/{limit}",
    "Set a subject's own maximum",
    scope="admin",
    ok={200: {"model": EntitlementOut, "description": "The change, as recorded."}},
    errors=(400, 404, 409, 415, 422),
    openapi_extra=json_body(EntitlementIn),
)
async def put_entitlement(
    subject: Subject, limit: LimitName, request: Request, context: Context
) -> Response:
    """The subject's own ``maximum`` for the limit from ``effective_from``
    (default now) on. An upgrade mid-window applies from then on and the
    window's usage carries over; a downgrade below the usage denies hard
    charges until the window resets and takes nothing back. 422 when no
    limit has the name; 409 for one of the product's own (``metering.*``)."""
    fields = await read_object(request, ENTITLEMENT_FIELDS)
    if fields.get("maximum") is None:  # null would be a return to the default: DELETE says so
        raise bad_field("maximum", "is required: a whole number (DELETE returns to the default)")
    maximum: Any = whole_number(fields["maximum"])
    start = moment(fields.get("effective_from"), "effective_from")
    change = await threaded(
        context.meter.set_entitlement, subject, limit, maximum, start, names=LIMIT_NAMES
    )
    return JSONResponse(change.to_dict())


@route(
    router.delete,
    "/entitlements/{subject:path}/{limit}",
    "Return a subject to the limit's default",
    scope="admin",
    ok={200: {"model": EntitlementOut, "description": "The change (maximum null), as recorded."}},
    errors=(400, 404, 409, 422),
)
async def delete_entitlement(
    subject: Subject,
    limit: LimitName,
    context: Context,
    effective_from: Annotated[
        str | None,
        Query(description="When the default applies again (default now); RFC 3339."),
    ] = None,
) -> Response:
    """Record a return to the limit's default maximum; the history stays, so
    earlier windows keep the maximum they had. 409 for a limit of the
    product's own (``metering.*``)."""
    start = moment(effective_from, "effective_from")
    change = await threaded(
        context.meter.delete_entitlement, subject, limit, start, names=LIMIT_NAMES
    )
    return JSONResponse(change.to_dict())


_listing(
    "/entitlements",
    "Changes of subjects' maximums",
    Entitlements,
    "Oldest first per subject and limit.",
    Meter.entitlements,
    "Every change of a subject's maximum (``metering entitlements list``).",
)


# -- grants ----------------------------------------------------------------------


@route(
    router.post,
    "/grants",
    "Top up a subject's allowance",
    scope="admin",
    ok={
        201: {"model": GrantAdded, "description": "A new grant."},
        200: {"model": GrantAdded, "description": "This grant existed already: nothing changed."},
    },
    errors=(400, 409, 415, 422),
    status_code=201,
    openapi_extra=json_body(GrantIn),
)
async def add_grant(request: Request, context: Context) -> Response:
    """``amount`` more of a fixed-window limit on top of the subject's maximum,
    from ``effective_from`` until ``expires_at``. Charges draw on the window's
    own allowance first, then on grants, the earliest expiring first; a new
    window does not renew a grant. Idempotent by ``grant_id``: 200 with
    ``duplicate`` for the same grant, 409 ``grant-conflict`` for other values
    (``reserved-limit`` for one of the product's own limits, ``metering.*``)."""
    fields = await read_object(request, GRANT_FIELDS)
    for required in ("subject", "limit", "amount"):
        if required not in fields:
            raise bad_field(required, "is required")
    expires = moment(fields.get("expires_at"), "expires_at")
    start = moment(fields.get("effective_from"), "effective_from")
    until = moment(fields.get("until"), "until")
    amount: Any = whole_number(fields["amount"])
    priority: Any = whole_number(fields.get("priority", DEFAULT_PRIORITY))
    rollover: Any = whole_number(fields.get("rollover_max"))
    low: Any = whole_number(fields.get("low"))
    if fields.get("every") is not None and not isinstance(fields["every"], str):
        raise bad_field("every", "must be a period such as 1mo")
    with fields_named(LIMIT_NAMES):
        grant = await run_in_threadpool(
            lambda: context.meter.grant(
                fields["subject"],
                fields["limit"],
                amount,
                expires,
                grant_id=fields.get("grant_id"),
                effective_from=start,
                reason=fields.get("reason"),
                every=fields.get("every"),
                rollover_max=rollover,
                priority=priority,
                until=until,
                low=low,
            )
        )
    body = {**grant.to_dict(), "duplicate": grant.duplicate}
    return JSONResponse(body, 200 if grant.duplicate else 201)


_listing(
    "/grants",
    "Grants",
    Grants,
    "With what is used and left of each.",
    Meter.grants,
    "Grants (at most 1000), with what is used and left of each; a customer's\n"
    "key lists its own subject's.",
    customers=True,
)
_listing(
    "/recurring-grants",
    "Recurring grants",
    RecurringGrants,
    "Their terms and next issue.",
    Meter.recurring_grants,
    "Recurring grants (``POST /v1/grants`` with ``every``), after making the\n"
    "issues now due; each issue is listed by ``GET /v1/grants``.",
)


# -- alerts ------------------------------------------------------------------------


@route(
    router.put,
    "/alerts/{subject:path}/{limit}",
    "Set a subject's own thresholds for a limit",
    scope="admin",
    ok={200: {"model": AlertOut, "description": "They replace the limit's for this subject."}},
    errors=(400, 404, 415, 422),
    openapi_extra=json_body(AlertIn),
)
async def set_alert(
    request: Request, context: Context, subject: Subject, limit: LimitName
) -> Response:
    """``limit.threshold`` for this subject fires at ``at`` (percentages of
    its maximum, amounts of usage) instead of at the limit's thresholds."""
    fields = await read_object(request, ALERT_FIELDS)
    if "at" not in fields:
        raise bad_field("at", "is required")
    at = fields["at"]
    if not isinstance(at, list):
        raise bad_field("at", "must be a list such as ['80%', 5000]")
    points: list[Any] = [whole_number(value) for value in at]
    alert = await threaded(context.meter.set_alert, subject, limit, points, names=LIMIT_NAMES)
    return JSONResponse(alert.to_dict())


@route(
    router.delete,
    "/alerts/{subject:path}/{limit}",
    "Back to the limit's thresholds",
    scope="admin",
    ok={200: {"model": AlertRemoved, "description": "The limit's thresholds apply again."}},
    errors=(400, 404, 422),
)
async def remove_alert(context: Context, subject: Subject, limit: LimitName) -> Response:
    """The subject's own thresholds for the limit are removed."""
    with fields_named(LIMIT_NAMES):
        removed = await run_in_threadpool(context.meter.remove_alert, subject, limit)
    return JSONResponse({"subject": subject, "limit": limit, "removed": removed})


_listing(
    "/alerts",
    "Subjects' own thresholds",
    Alerts,
    "By limit and subject.",
    Meter.alerts,
)


# -- corrections -----------------------------------------------------------------


@route(
    router.post,
    "/events/{event_id:path}/void",
    "Void an event",
    scope="admin",
    ok={
        201: {"model": Voided, "description": "Voided now."},
        200: {"model": Voided, "description": "Voided before: that correction."},
    },
    errors=(400, 404, 409, 415),
    status_code=201,
    openapi_extra=json_body(VoidIn),
)
async def void_event(
    event_id: Annotated[
        str,
        Path(
            description="The event id (it may hold /).",
            json_schema_extra={"pattern": EVENT_ID_PATTERN},
        ),
    ],
    request: Request,
    context: Context,
) -> Response:
    """Reverse an allowed event's charges in their own windows (past ones
    too, within the horizon: 35 days) and give back to grants still active
    what they paid. The event's result stays; the correction references it.
    Voiding again answers 200 with that correction (``duplicate``). 404 for
    an event never decided; 409 ``correction-refused`` for one that was
    denied or rejected (it consumed nothing) or is past the horizon, 409
    ``correction-conflict`` for a correction id that voids another event."""
    fields = await read_object(request, VOID_FIELDS)
    if "reason" not in fields:
        raise bad_field("reason", "is required")
    correction = await run_in_threadpool(
        lambda: context.meter.void(
            event_id, fields["reason"], correction_id=fields.get("correction_id")
        )
    )
    body = {**correction.to_dict(), "duplicate": correction.duplicate}
    return JSONResponse(body, 200 if correction.duplicate else 201)


@route(
    router.get,
    "/corrections",
    "Voided events",
    scope="read",
    ok={200: {"model": Corrections, "description": "Oldest first."}},
    errors=(400,),
)
async def list_corrections(
    context: Context,
    count: Annotated[
        int, Query(ge=1, le=MAX_CORRECTIONS, description="How many, oldest first.")
    ] = MAX_CORRECTIONS,
) -> Response:
    """Voided events and what each gave back (``metering corrections list``)."""
    return await listed("corrections", context.meter.corrections, count)
