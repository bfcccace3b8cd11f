"""Limits over HTTP: ``GET /v1/limits``, and ``GET``, ``PUT`` and ``DELETE
/v1/limits/{name}``.

A ``PUT`` body is a limit's definition as a limits file writes it
(``metering limits load``): ``maximum`` and ``period``, and optionally
``algorithm``, ``window``, ``enforcement`` (``hard``, ``soft`` or ``shadow``),
``thresholds``, ``thresholds_units``, ``lateness``, ``dimensions``,
``distinct`` (seats: the metadata key whose distinct values are counted),
``aggregation`` (``sum``, or a gauge's ``max`` or ``latest``), ``pacing``
and ``burst`` (units or ``"P%"``), ``forecast_lead`` (``limit.forecast``),
``breaker``, ``breaker_floor`` and ``quarantine_max`` (the runaway breaker);
``name`` may be given if it is the name in the path. It is validated by
`Limit.from_dict`, the loader's own rules, and stored with `Meter.set_limit`:
created, or replaced as a whole (a field not given takes its default).
Reading limits takes the ``read`` scope; changing them ``admin``.

Names starting with ``metering.`` are the product's own (the API's rate per
key, `metering.api.ratelimit`): ``PUT`` and ``DELETE`` of one are 409
(``reserved-limit``), and ``GET /v1/limits`` leaves them out unless
``?all=true``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import bad_field, fields_named, json_body, read_object
from metering.api.context import Context
from metering.api.models import LIMIT_PATTERN, body_fields
from metering.api.problems import ApiProblem
from metering.api.routes import route
from metering.domain.limits import (
    DIMENSION_PATTERN,
    MAX_DIMENSIONS,
    MAX_MAXIMUM,
    MAX_THRESHOLD_PERCENT,
    MAX_THRESHOLDS,
    Aggregation,
    Algorithm,
    Enforcement,
    Limit,
    WindowKind,
    is_reserved,
    validate_limit_name,
)
from metering.errors import UnknownLimit


class LimitIn(BaseModel):
    """A limit's definition, as in a limits file (``metering limits load``)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None, pattern=LIMIT_PATTERN, description="If given, the name in the path."
    )
    maximum: int | None = Field(
        default=None,
        ge=1,
        le=MAX_MAXIMUM,
        description="Inclusive maximum per period (a spend limit: max_amount instead).",
    )
    max_amount: str | None = Field(
        default=None,
        pattern=r"^[0-9]+(\.[0-9]+)?$",
        max_length=40,
        examples=["50.00"],
        description="A spend limit's maximum in major units of its currency.",
    )
    currency: str | None = Field(
        default=None,
        min_length=3,
        max_length=3,
        description="ISO 4217: makes a spend limit (its amounts are minor units inside).",
    )
    period: str | None = Field(
        default=None,
        pattern=r"^[ \t]*[0-9]+[ \t]*(s|m|h|d|w|mo|y)[ \t]*$",
        max_length=32,
        examples=["1h", "1mo"],
        description="30s, 2m, 1h, 1d, 2w, 1mo, 1y; at most 10 years. Required, except for "
        "a concurrent limit (floating licenses), which has none.",
    )
    algorithm: Algorithm = Field(
        default="fixed_window",
        description="fixed_window, token_bucket, or concurrent: floating licenses held at "
        "once (POST /v1/checkouts), with no period, window or thresholds.",
    )
    window: WindowKind = Field(default="first_use", description="Fixed window only.")
    enforcement: Enforcement = Field(
        default="hard",
        description="hard denies; soft allows and counts overage; shadow decides like hard, "
        "records would_deny and never denies. A token bucket is hard or shadow.",
    )
    thresholds: list[int] = Field(
        default=[],
        max_length=MAX_THRESHOLDS,
        description="Percentages of the maximum that send limit.threshold.",
        json_schema_extra={
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_THRESHOLD_PERCENT}
        },
    )
    lateness: str = Field(
        default="1d",
        pattern=r"^[ \t]*[0-9]+[ \t]*(s|m|h|d|w)[ \t]*$",
        max_length=32,
        description="How late an event may arrive.",
    )
    thresholds_units: list[int] = Field(
        default=[],
        max_length=MAX_THRESHOLDS,
        description="Absolute amounts of usage that send limit.threshold (threshold_units).",
        json_schema_extra={"items": {"type": "integer", "minimum": 1, "maximum": MAX_MAXIMUM}},
    )
    dimensions: list[str] = Field(
        default=[],
        max_length=MAX_DIMENSIONS,
        description="Metadata keys whose values usage is recorded by, hour by hour "
        "(GET /v1/reports/usage?group_by=KEY).",
        json_schema_extra={
            "items": {"type": "string", "pattern": f"^{DIMENSION_PATTERN.pattern}$"}
        },
    )
    distinct: str | None = Field(
        default=None,
        pattern=f"^{DIMENSION_PATTERN.pattern}$",
        examples=["user"],
        description="Seats: count the distinct values of this metadata key per window "
        "(an event's first value in the window costs 1, a repeat 0). Fixed window only; "
        "every event charging the limit must carry the key. See docs/seats.md.",
    )
    aggregation: Aggregation = Field(
        default="sum",
        description="sum: costs add up. max or latest: a gauge; each event's cost is a level "
        "it reports (0 allowed), used is the window's peak or last allowed level. A gauge is "
        "a fixed window without distinct, currency, dimensions, grants, prices or "
        "reservations. See docs/gauges.md.",
    )
    pacing: bool = Field(
        default=False,
        description="Spread the maximum over the window: by an instant, at most its share "
        "of the maximum plus burst (a fixed window that is not a gauge). See docs/pacing.md.",
    )
    burst: int | str | None = Field(
        default=None,
        examples=["5%", 100],
        description="With pacing: units, or a percentage of the maximum in force like "
        "'5%' (the default), allowed ahead of the pace.",
    )
    forecast_lead: str | None = Field(
        default=None,
        pattern=r"^[ \t]*[0-9]+[ \t]*(s|m|h|d|w)[ \t]*$",
        max_length=32,
        examples=["24h"],
        description="Send limit.forecast once per window when, at the subject's recent "
        "rate, the maximum in force runs out within this long (a fixed window that is not "
        "a gauge). See docs/forecasts.md.",
    )
    breaker: str | None = Field(
        default=None,
        max_length=16,
        examples=["10x"],
        description="Quarantine a subject whose rate runs past this multiple of its own "
        "baseline for a minute (2x to 1000x; a fixed window that is not a gauge). "
        "See docs/breaker.md.",
    )
    breaker_floor: float | None = Field(
        default=None,
        gt=0,
        examples=[0.5],
        description="With a breaker: the least baseline, in units per second, so a subject "
        "with under a day of history is judged.",
    )
    quarantine_max: int | None = Field(
        default=None,
        ge=1,
        examples=[100],
        description="With a breaker: what a quarantined subject may use of a window "
        "(default: the maximum divided by the factor).",
    )


class LimitOut(BaseModel):
    name: str
    maximum: int
    period: str = Field(description="Empty for a concurrent limit.")
    algorithm: Algorithm
    window: WindowKind
    enforcement: Enforcement
    thresholds: list[int]
    lateness: str
    thresholds_units: list[int]
    dimensions: list[str]
    currency: str | None = Field(default=None, description="A spend limit's currency.")
    max_amount: str | None = Field(default=None, description="A spend limit's maximum.")
    distinct: str | None = None
    aggregation: Aggregation = Field(default="sum", description="sum, or a gauge's max or latest.")
    pacing: bool = Field(default=False, description="Only present (true) on a paced limit.")
    burst: int | str | None = Field(default=None, description="A paced limit's burst.")
    forecast_lead: str | None = Field(
        default=None, description="Only present on a limit with a forecast lead."
    )
    breaker: str | None = Field(default=None, description="Only present with a breaker.")
    breaker_floor: float | None = Field(default=None, description="A breaker's floor.")
    quarantine_max: int | None = Field(default=None, description="A breaker's quarantine max.")


class Limits(BaseModel):
    limits: list[LimitOut] = Field(description="By name.")


def limit_json(limit: Limit) -> dict[str, Any]:
    return limit.to_dict()


# -- the routes ---------------------------------------------------------------------

router = APIRouter(prefix="/v1", tags=["limits"])

LIMIT_FIELDS: Final = body_fields(LimitIn)

LimitName = Annotated[
    str,
    Path(
        pattern=LIMIT_PATTERN,
        description="The limit's name: 1 to 64 of a-z 0-9 _ . : -",
        examples=["api_calls"],
    ),
]


def _not_found(exc: UnknownLimit) -> ApiProblem:
    # Here the limit is the resource asked for: 404, where a charge naming one is a 422.
    return ApiProblem("not-found", f"no limit {exc.limit!r}")


def _name(name: str) -> str:
    with fields_named():
        return validate_limit_name(name)


@route(
    router.get,
    "/limits",
    "Every limit",
    scope="read",
    ok={200: {"model": Limits, "description": "Every limit, by name."}},
    errors=(400,),
)
async def list_limits(
    context: Context,
    all: Annotated[bool, Query(description="Also the product's own limits (metering.*).")] = False,
) -> Response:
    """Every limit's definition, by name (``metering limits list``); the
    product's own (``metering.*``) only with ``?all=true``."""
    found = await run_in_threadpool(context.meter.list_limits)
    shown = [limit for limit in found if all or not is_reserved(limit.name)]
    return JSONResponse({"limits": [limit_json(limit) for limit in shown]})


@route(
    router.get,
    "/limits/{name}",
    "A limit",
    scope="read",
    ok={200: {"model": LimitOut, "description": "The limit's definition."}},
    errors=(400, 404),
)
async def get_limit(name: LimitName, context: Context) -> Response:
    """A limit's definition; 404 when no limit has this name."""
    try:
        limit = await run_in_threadpool(context.meter.get_limit, _name(name))
    except UnknownLimit as exc:
        raise _not_found(exc) from None
    return JSONResponse(limit_json(limit))


@route(
    router.put,
    "/limits/{name}",
    "Create or replace a limit",
    scope="admin",
    ok={200: {"model": LimitOut, "description": "The limit as stored."}},
    errors=(400, 409, 415),
    openapi_extra=json_body(LimitIn),
)
async def put_limit(name: LimitName, request: Request, context: Context) -> Response:
    """Create the limit, or replace its whole definition: events decided from
    now on use it. 400 names the field at fault; nothing is stored then.
    Counters keep their usage. 409 for a name of the product's own."""
    chosen = _name(name)
    fields = await read_object(request, LIMIT_FIELDS)
    if "name" in fields and fields["name"] != chosen:
        raise bad_field("name", f"must be the name in the path ({chosen!r}) or left out")
    with fields_named():
        limit = Limit.from_dict(fields, name=chosen)
    stored = await run_in_threadpool(context.meter.set_limit, limit)
    return JSONResponse(limit_json(stored))


@route(
    router.delete,
    "/limits/{name}",
    "Delete a limit",
    scope="admin",
    ok={204: {"description": "Deleted; its counters stay, for reports."}},
    errors=(400, 404, 409),
    status_code=204,
)
async def delete_limit(name: LimitName, context: Context) -> Response:
    """Delete a limit: events naming it are refused from now on (422 unknown
    limit). Its counters stay for ``metering counters``; reports leave them out.
    409 for a name of the product's own (``metering.*``)."""
    try:
        await run_in_threadpool(context.meter.delete_limit, _name(name))
    except UnknownLimit as exc:
        raise _not_found(exc) from None
    return Response(status_code=204)
