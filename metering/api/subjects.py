"""Subjects' time zones over HTTP.

``PUT /v1/subjects/{subject}`` with ``{"time_zone": "Asia/Kolkata"}`` (``admin``) aligns the
subject's calendar windows of days and months on its local midnight, from the end of
each current window on; ``GET /v1/subjects/{subject}`` and ``GET /v1/subjects``
(``read``) show them. One call of `Meter` each; an unknown zone is a 400 naming
``time_zone``, and nothing is stored. A subject may hold ``/``: the path takes it whole.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import bad_field, json_body, read_object, threaded
from metering.api.context import Context
from metering.api.models import SUBJECT_PATTERN, body_fields
from metering.api.routes import route
from metering.domain.events import MAX_SUBJECT_LENGTH

router = APIRouter(prefix="/v1", tags=["subjects"])


class SubjectIn(BaseModel):
    """A subject's settings."""

    model_config = ConfigDict(extra="forbid")

    time_zone: str = Field(
        description="An IANA time zone: the subject's days and months start at its midnight.",
        examples=["Asia/Kolkata"],
    )


class SubjectOut(BaseModel):
    subject: str
    time_zone: str = Field(description="UTC when the subject was never given one.")
    since: datetime | None = Field(description="When it was set; null: never.")


class Subjects(BaseModel):
    subjects: list[SubjectOut]


SUBJECT_FIELDS: Final = body_fields(SubjectIn)
Subject = Annotated[
    str,
    Path(
        description="The subject (it may hold /; URL-encoded).",
        json_schema_extra={"pattern": SUBJECT_PATTERN, "maxLength": MAX_SUBJECT_LENGTH},
    ),
]


@route(
    router.put,
    "/subjects/{subject:path}",
    "Set a subject's time zone",
    scope="admin",
    ok={200: {"model": SubjectOut, "description": "The subject's zone, as recorded."}},
    errors=(400, 415),
    openapi_extra=json_body(SubjectIn),
)
async def put_subject(subject: Subject, request: Request, context: Context) -> Response:
    """The subject's calendar windows of whole days and months start at its local
    midnight in ``time_zone``, from where each current window ends (that window keeps
    its bounds); periods shorter than a day, first-use windows and buckets stay as
    they are. Setting the zone in force changes nothing."""
    fields = await read_object(request, SUBJECT_FIELDS)
    if "time_zone" not in fields:
        raise bad_field("time_zone", "is required: an IANA time zone such as 'Asia/Kolkata'")
    found = await threaded(context.meter.set_time_zone, subject, fields["time_zone"])
    return JSONResponse(found.to_dict())


@route(
    router.get,
    "/subjects",
    "Subjects with a time zone",
    scope="read",
    ok={200: {"model": Subjects, "description": "By subject."}},
)
async def list_subjects(context: Context) -> Response:
    """Every subject given a time zone."""
    found = await threaded(context.meter.subject_zones)
    return JSONResponse({"subjects": [item.to_dict() for item in found]})


@route(
    router.get,
    "/subjects/{subject:path}",
    "A subject's time zone",
    scope="read",
    subjects="path",
    ok={200: {"model": SubjectOut, "description": "UTC, since null, when never set."}},
    errors=(400,),
)
async def get_subject(subject: Subject, context: Context) -> Response:
    """The subject's time zone and since when."""
    found = await threaded(context.meter.subject_zone, subject)
    return JSONResponse(found.to_dict())
