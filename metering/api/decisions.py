"""``POST /v1/check`` (would it be allowed?) and ``GET /v1/subjects/{subject}/usage``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.auth import AUTH_ERRORS, require_scope
from metering.api.context import ApiContext, api_context
from metering.api.models import (
    DecisionOut,
    SubjectInPath,
    SubjectUsage,
    decision_json,
    usage_json,
)
from metering.api.parsing import parse_check
from metering.api.problems import COMMON_ERRORS, ApiProblem, responses
from metering.errors import InvalidInput, OccurredAtOutOfRange, UnknownLimit
from metering.lookup import subject_usage

router = APIRouter(prefix="/v1", tags=["decisions"])

CHECK_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": "#/components/schemas/SingleCheck"},
                        {"$ref": "#/components/schemas/StackedCheck"},
                    ]
                }
            }
        },
    }
}


@router.post(
    "/check",
    summary="Would it be allowed?",
    response_model=None,
    openapi_extra=CHECK_BODY,
    responses={
        200: {"model": DecisionOut, "description": "What consuming would decide now."},
        **responses(400, 415, 422, *AUTH_ERRORS, *COMMON_ERRORS),
    },
    dependencies=[require_scope("read")],
)
async def check(request: Request, context: Annotated[ApiContext, Depends(api_context)]) -> Response:
    """What consuming these charges would decide now; consumes and records nothing."""
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiProblem("unsupported-media-type", "send application/json")
    parsed = parse_check(await request.body(), context.meter.clock())
    event = parsed.event
    try:
        decision = await run_in_threadpool(
            lambda: context.meter.check(
                charges=event.charges, occurred_at=event.occurred_at, metadata=event.metadata
            )
        )
    except UnknownLimit as exc:
        errors = [
            (parsed.charge_pointer(index, "limit"), str(exc))
            for index, charge in enumerate(event.charges)
            if charge.limit == exc.limit
        ]
        raise ApiProblem("unknown-limit", str(exc), errors) from None
    except OccurredAtOutOfRange as exc:
        raise ApiProblem("invalid-input", str(exc), [(parsed.time_pointer, exc.message)]) from None
    except InvalidInput as exc:  # a seat limit's value missing or malformed (docs/seats.md)
        raise ApiProblem("invalid-input", str(exc), [(f"/{exc.field}", exc.message)]) from None
    return JSONResponse(decision_json(decision))


@router.get(
    "/subjects/{subject}/usage",
    summary="A subject's usage now",
    response_model=None,
    responses={
        200: {"model": SubjectUsage, "description": "Every limit with a current counter."},
        **responses(400, *AUTH_ERRORS, *COMMON_ERRORS),
    },
    dependencies=[require_scope("read", subjects="path")],
)
async def usage(
    subject: SubjectInPath,
    context: Annotated[ApiContext, Depends(api_context)],
) -> Response:
    """Every limit the subject has a counter for in its current window: what a
    charge of 1 would meet now (``retry_at`` when it would be denied)."""
    found = await run_in_threadpool(subject_usage, context.meter.database, subject)
    return JSONResponse({"subject": subject, "limits": [usage_json(u) for u in found]})
