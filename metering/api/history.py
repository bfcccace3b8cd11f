"""``GET /v1/subjects/{subject}/usage/history``: a subject's usage over time.

Per hour or day, the usage of one limit and the maximum in force in each
bucket (`metering.usage.history`: from the rollups for limits with dimensions,
else from the counters' windows). A customer's key reads its own subject
only (`metering.api.auth`: another subject is 404).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import fields_named
from metering.api.context import Context
from metering.api.models import SubjectInPath
from metering.api.routes import route
from metering.domain.instants import parse_instant
from metering.usage.history import usage_history

router = APIRouter(prefix="/v1", tags=["decisions"])


class HistoryPoint(BaseModel):
    start: str = Field(description="The bucket's start (UTC).")
    end: str = Field(description="The bucket's end, exclusive.")
    used: int = Field(description="Usage counted in the bucket.")
    maximum: int | None = Field(
        description="The maximum in force at the bucket's end: the subject's entitlement, "
        "else the limit's default then (null for a token bucket)."
    )
    time_zone: str | None = Field(
        default=None,
        description="A subject with a time zone: the zone in force at the bucket's start; "
        "else null.",
    )
    local_window: str | None = Field(
        default=None,
        description="The bucket in local time, e.g. '2026-11-01 05:30:00+05:30 to "
        "2026-11-02 05:30:00+05:30 Asia/Kolkata'; else null.",
    )


class UsageHistoryOut(BaseModel):
    subject: str
    limit: str
    bucket: Literal["hour", "day"]
    source: Literal["rollups", "counters", "none"] = Field(
        description="rollups: exact per hour (limits with dimensions); counters: each "
        "window's usage in the bucket it starts in; none: a token bucket keeps no history."
    )
    from_: str = Field(alias="from")
    to: str
    points: list[HistoryPoint]


@route(
    router.get,
    "/subjects/{subject}/usage/history",
    "A subject's usage over time",
    scope="read",
    subjects="path",
    ok={200: {"model": UsageHistoryOut, "description": "Every bucket, oldest first."}},
    errors=(400, 404, 422),
)
async def history(
    subject: SubjectInPath,
    context: Context,
    limit: Annotated[str, Query(description="The limit.")],
    since: Annotated[
        str | None,
        Query(alias="from", description="RFC 3339 (default: 48 hours or 30 days before to)."),
    ] = None,
    until: Annotated[str | None, Query(alias="to", description="RFC 3339 (default: now).")] = None,
    bucket: Annotated[Literal["hour", "day"], Query(description="hour or day (UTC).")] = "day",
) -> Response:
    """The subject's usage of ``limit`` per hour or day over ``[from, to)``,
    with the maximum in force in each bucket (at most 2,000 buckets)."""
    with fields_named():
        start = None if since is None else parse_instant(since, field_name="from")
        end = None if until is None else parse_instant(until, field_name="to")
        found: Any = await run_in_threadpool(
            lambda: usage_history(
                context.meter.database, subject, limit, since=start, until=end, bucket=bucket
            )
        )
    return JSONResponse(found.to_dict())
