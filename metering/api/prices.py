"""Prices and the spend report over HTTP.

``PUT /v1/prices/{limit}`` (body ``{"per_unit": "0.002", "currency":
"USD", "effective_from": ...}``, or a ``model`` with its ``tiers``, ``package``
and ``per_package``, and a ``flat_fee``) and ``DELETE /v1/prices/{limit}?currency=USD``
change a limit's price (``admin`` scope); ``GET /v1/prices`` lists the
changes and ``GET /v1/reports/spend?period=2026-11`` is ``metering report
spend`` (``read`` scope), as JSON or, with ``format=csv`` or ``Accept:
text/csv``, CSV. Amounts are exact decimal strings in major units (never
JSON numbers: a float would not be exact). Each call is one `Meter` call,
whose rules check every value: a bad one is a 400 naming its field, and
nothing is stored.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from typing import Annotated, Final, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

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
from metering.api.context import Context
from metering.api.models import LIMIT_PATTERN, LimitFilter, SubjectFilter, body_fields
from metering.api.reports import MEDIA, FormatChoice, negotiate
from metering.api.routes import route
from metering.domain.money import MAX_TIERS
from metering.reports.spend import spend_report

AMOUNT_PATTERN: Final = r"^[0-9]+(\.[0-9]+)?$"


class TierIn(BaseModel):
    """A tier: the window total it prices up to (null: no end), and its price per unit."""

    model_config = ConfigDict(extra="forbid")

    up_to: int | None = Field(gt=0, examples=[1000], description="Units of the window; null: inf.")
    price: str = Field(pattern=AMOUNT_PATTERN, max_length=40, examples=["0.01"])


class PriceIn(BaseModel):
    """A limit's price from an instant on: per unit, or by a model, with a flat fee."""

    model_config = ConfigDict(extra="forbid")

    per_unit: str | None = Field(
        default=None,
        pattern=AMOUNT_PATTERN,
        max_length=40,
        examples=["0.002"],
        description="Major units, as a decimal string; up to 6 decimals beyond the minor unit. "
        "Required with the per_unit model, refused with the others.",
    )
    currency: str = Field(min_length=3, max_length=3, examples=["USD"], description="ISO 4217.")
    effective_from: datetime | None = Field(
        default=None, description="When it takes effect (default now). RFC 3339; naive is UTC."
    )
    model: Literal["per_unit", "graduated", "volume", "package"] = Field(
        default="per_unit",
        description="graduated: each unit of the window at its tier's price; volume: every "
        "unit at the price of the tier the window's total reaches; package: per_package for "
        "each block of package units, rounded up.",
    )
    tiers: list[TierIn] | None = Field(
        default=None,
        max_length=MAX_TIERS,
        description="graduated and volume: sorted by up_to, the last with up_to null.",
    )
    package: int | None = Field(default=None, gt=0, description="package: units in a package.")
    per_package: str | None = Field(
        default=None, pattern=AMOUNT_PATTERN, max_length=40, description="package: major units."
    )
    flat_fee: str | None = Field(
        default=None,
        pattern=AMOUNT_PATTERN,
        max_length=40,
        description="Major units charged once a window, with the charge that starts it.",
    )


class TierOut(BaseModel):
    up_to: int | None
    price: str


class PriceOut(BaseModel):
    """One price change; ``per_unit`` null with the per_unit model: no price from then on."""

    limit: str
    currency: str
    per_unit: str | None
    per_unit_micro_minor: int | None = Field(description="The price as held: 1e-6 minor units.")
    effective_from: datetime
    model: str
    tiers: list[TierOut] | None = Field(default=None, description="graduated and volume.")
    package: int | None = None
    per_package: str | None = None
    flat_fee: str | None = Field(default=None, description="Major units, once a window.")


class Prices(BaseModel):
    prices: list[PriceOut] = Field(description="By limit, oldest first.")


class SpendRowOut(BaseModel):
    subject: str
    currency: str
    amounts: dict[str, str] = Field(description="Per priced limit, major units.")
    total: str
    spend_limit: str | None
    cap: str | None = Field(description="The subject's cap at the period's end, major units.")


class SpendOut(BaseModel):
    report: str
    period: str
    rows: list[SpendRowOut]


router = APIRouter(prefix="/v1", tags=["prices and spend"])
PRICE_FIELDS: Final = body_fields(PriceIn)
LimitName = Annotated[
    str, Path(description="The limit's name.", json_schema_extra={"pattern": LIMIT_PATTERN})
]


@route(
    router.put,
    "/prices/{limit}",
    "Price a limit per unit",
    scope="admin",
    ok={200: {"model": PriceOut, "description": "The price, as recorded."}},
    errors=(400, 409, 415, 422),
    openapi_extra=json_body(PriceIn),
)
async def put_price(limit: LimitName, request: Request, context: Context) -> Response:
    """The limit's price per unit from ``effective_from`` (default now) on:
    every charge of it also charges its subject's spend limits of the
    currency. 422 when no limit has the name."""
    fields = await read_object(request, PRICE_FIELDS)
    if not isinstance(fields.get("currency"), str):
        raise bad_field("currency", "is required: a string")
    model = fields.get("model", "per_unit")
    for name in ("per_unit", "model", "per_package", "flat_fee"):
        if fields.get(name) is not None and not isinstance(fields[name], str):
            raise bad_field(name, "must be a string")
    if model == "per_unit" and not isinstance(fields.get("per_unit"), str):
        raise bad_field("per_unit", "is required: a string")
    package = fields.get("package")
    if package is not None and (isinstance(package, bool) or not isinstance(package, int)):
        raise bad_field("package", "must be a whole number")
    start = moment(fields.get("effective_from"), "effective_from")
    price = await threaded(
        context.meter.set_price,
        limit,
        fields.get("per_unit"),
        fields["currency"],
        start,
        model=model,
        tiers=_tiers(fields.get("tiers")),
        package=package,
        per_package=fields.get("per_package"),
        flat_fee=fields.get("flat_fee"),
        names=LIMIT_NAMES,
    )
    return JSONResponse(price.to_dict())


def _tiers(value: object) -> list[tuple[object, object]]:
    """The body's tiers as (up_to, price) pairs, checked by `Meter.set_price`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_field("tiers", "must be a list of {up_to, price}")
    found: list[tuple[object, object]] = []
    for tier in value:
        if not isinstance(tier, dict) or set(tier) != {"up_to", "price"}:
            raise bad_field("tiers", "each tier is an object {up_to, price}")
        up_to, price = tier["up_to"], tier["price"]
        if not isinstance(price, str):
            raise bad_field("tiers", "a tier's price must be a string")
        found.append((up_to, price))
    return found


@route(
    router.delete,
    "/prices/{limit}",
    "End a limit's price",
    scope="admin",
    ok={200: {"model": PriceOut, "description": "The change (per_unit null), as recorded."}},
    errors=(400, 409, 422),
)
async def delete_price(
    limit: LimitName,
    context: Context,
    currency: Annotated[str, Query(description="The currency of the price that ends.")],
    effective_from: Annotated[
        str | None, Query(description="When the price ends (default now); RFC 3339.")
    ] = None,
) -> Response:
    """No price from ``effective_from`` on; earlier usage keeps its price."""
    start = moment(effective_from, "effective_from")
    price = await threaded(context.meter.remove_price, limit, currency, start, names=LIMIT_NAMES)
    return JSONResponse(price.to_dict())


@route(
    router.get,
    "/prices",
    "Price changes",
    scope="read",
    ok={200: {"model": Prices, "description": "By limit, oldest first."}},
    errors=(400,),
)
async def list_prices(
    context: Context,
    limit: LimitFilter = None,
) -> Response:
    """Every price change (``metering prices list``)."""
    return await listed("prices", context.meter.prices, limit, names=LIMIT_NAMES)


@route(
    router.get,
    "/reports/spend",
    "The spend report",
    scope="read",
    ok={
        200: {
            "model": SpendOut,
            "description": "The report: JSON, or CSV (a header, then one line a row).",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        }
    },
    errors=(400, 406),
)
async def spend(
    request: Request,
    context: Context,
    period: Annotated[
        str,
        Query(pattern=r"^[0-9]{4}-[0-9]{2}$", description="A calendar month (UTC): 2026-11."),
    ],
    subject: SubjectFilter = None,
    fmt: FormatChoice = None,
) -> Response:
    """Per subject and currency, the amount of each priced limit, the total
    and the cap of each spend limit: ``metering report spend``."""
    chosen = fmt or negotiate(request.headers.get("accept"))
    with fields_named(LIMIT_NAMES):
        found = await run_in_threadpool(spend_report, context.meter, period, subject)
    if chosen == "json":
        return Response(json.dumps(found.to_dict()), media_type=MEDIA["json"])
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(found.csv_header())
    writer.writerows(found.csv_rows())
    headers = {"Content-Disposition": 'attachment; filename="spend.csv"', "Vary": "Accept"}
    return Response(out.getvalue(), media_type=MEDIA["csv"], headers=headers)
