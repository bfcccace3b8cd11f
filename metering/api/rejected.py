"""``GET /v1/rejected``: what the workers could not apply, newest first, as
`metering rejected` lists it: rejected events (unknown limit, too late) whole,
malformed messages and reused ids, each with why. An admin's: it shows the
input of every subject. ``metering rejected replay`` applies the events once
they are acceptable."""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import threaded
from metering.api.context import Context
from metering.api.routes import route

MAX_REJECTED: Final = 1000


class RejectedOut(BaseModel):
    event_id: str | None = Field(description="The event's id; null when the input had none.")
    reason: str = Field(description="Why it was not applied.")
    raw: str = Field(description="The input as received (a rejected event: the whole event).")


class RejectedList(BaseModel):
    rejected: list[RejectedOut] = Field(description="Newest first.")


router = APIRouter(prefix="/v1", tags=["rejected input"])


@route(
    router.get,
    "/rejected",
    "Rejected input",
    scope="admin",
    ok={200: {"model": RejectedList, "description": "Newest first."}},
    errors=(400,),
)
async def list_rejected(
    context: Context,
    count: Annotated[
        int, Query(ge=1, le=MAX_REJECTED, description="How many, newest first.")
    ] = 100,
) -> Response:
    """Events the workers rejected and messages they could not read (``metering rejected``)."""
    found = await threaded(context.meter.rejected_messages, count)
    return JSONResponse({"rejected": [row._asdict() for row in found]})
