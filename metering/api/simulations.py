"""``POST /v1/simulations``: backtest proposed limits on the stored demand
(`Meter.simulate`, as ``metering simulate``), for an admin key.

The body carries the limits and entitlements as JSON, in the shapes of the
files ``metering limits load`` and ``metering entitlements load`` read
(`metering.limits.files.limits_from_data`, `entitlements_from_data`), ``since``
(a duration before now such as ``30d``, or an RFC 3339 time) and optionally
``subject``. Nothing is written; the answer is the figures per subject and
limit.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import bad_field, invalid, json_body, read_object
from metering.api.context import Context
from metering.api.models import body_fields
from metering.api.routes import route
from metering.errors import ConfigurationError, InvalidInput
from metering.limits.files import entitlements_from_data, limits_from_data
from metering.simulation import parse_since


class SimulationIn(BaseModel):
    """A backtest: proposed limits (and entitlements) and the period to replay."""

    model_config = ConfigDict(extra="forbid")

    limits: dict[str, dict[str, Any]] | list[dict[str, Any]] = Field(
        description="As a limits file: a mapping of name to fields, or a list of limits "
        "each with a name. Laid over the limits in force; nothing is stored.",
    )
    entitlements: list[dict[str, Any]] = Field(
        default=[],
        description="As an entitlements file: {subject, limit, maximum, effective_from?}; "
        "added to the stored ones. Without effective_from: from the start of the period.",
    )
    since: str = Field(
        max_length=64,
        examples=["30d", "2026-11-01T00:00:00Z"],
        description="Replay events since: a duration before now (30d, 12h, 2w) or an "
        "RFC 3339 time; refused when results of that period may have been pruned.",
    )
    subject: str | None = Field(default=None, description="Only this subject's charges.")


class SimulationRowOut(BaseModel):
    subject: str
    limit: str
    events: int = Field(description="Events with a charge of this subject and limit.")
    would_deny_events: int = Field(description="Events whose charge would not fit.")
    would_deny_cost: int = Field(description="Their cost.")
    overage: int = Field(description="Allowed usage above the maximum (soft limits).")
    denied_events_then: int = Field(description="Events this limit denied when decided.")


class SimulationOut(BaseModel):
    since: str
    until: str
    events: int = Field(description="Events replayed.")
    rows: list[SimulationRowOut] = Field(description="By subject, then limit.")


router = APIRouter(prefix="/v1", tags=["simulations"])

SIMULATION_FIELDS: Final = body_fields(SimulationIn)


@route(
    router.post,
    "/simulations",
    "Backtest proposed limits",
    scope="admin",
    ok={200: {"model": SimulationOut, "description": "What the proposed limits would decide."}},
    errors=(400, 415),
    openapi_extra=json_body(SimulationIn),
)
async def post_simulation(request: Request, context: Context) -> Response:
    """Replay the results ledger's events since ``since`` (decided events,
    voided ones left out, in event-time order) through the proposed limits
    and entitlements, in memory. 400 names the field at fault, or says the
    period is older than the results kept. Nothing is written."""
    fields = await read_object(request, SIMULATION_FIELDS)
    if "limits" not in fields:
        raise bad_field("limits", "is required")
    if "since" not in fields:
        raise bad_field("since", "is required")
    subject = fields.get("subject")
    try:
        limits = limits_from_data(fields["limits"], "limits")
        entitlements = entitlements_from_data(fields.get("entitlements", []), "entitlements")
        since = parse_since(fields["since"])
    except ConfigurationError as exc:  # a shape the loader refuses, not a server fault
        raise bad_field("limits", str(exc)) from None
    except InvalidInput as exc:
        raise invalid(exc) from None
    found = await run_in_threadpool(
        lambda: context.meter.simulate(limits, entitlements, since=since, subject=subject)
    )
    return JSONResponse(found.to_dict())
