"""``POST /v1/check`` (would it be allowed?) and ``GET /v1/subjects/{subject}/usage``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.context import Context
from metering.api.models import (
    DecisionOut,
    SubjectInPath,
    SubjectUsage,
    decision_json,
    usage_json,
)
from metering.api.parsing import parse_check
from metering.api.problems import ApiProblem
from metering.api.queueing import refused_charges
from metering.api.routes import route
from metering.errors import InvalidInput, OccurredAtOutOfRange, UnknownLimit
from metering.usage.current import subject_usage

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


@route(
    router.post,
    "/check",
    "Would it be allowed?",
    scope="read",
    ok={200: {"model": DecisionOut, "description": "What consuming would decide now."}},
    errors=(400, 415, 422),
    openapi_extra=CHECK_BODY,
)
async def check(request: Request, context: Context) -> Response:
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
        raise await run_in_threadpool(refused_charges, context.meter, [parsed], exc) from None
    return JSONResponse(decision_json(decision))


@route(
    router.get,
    "/subjects/{subject}/usage",
    "A subject's usage now",
    scope="read",
    subjects="path",
    ok={200: {"model": SubjectUsage, "description": "Every limit with a current counter."}},
    errors=(400,),
)
async def usage(
    subject: SubjectInPath,
    context: Context,
) -> Response:
    """Every limit the subject has a counter for in its current window: what a
    charge of 1 would meet now (``retry_at`` when it would be denied)."""
    found = await run_in_threadpool(subject_usage, context.meter.database, subject)
    return JSONResponse({"subject": subject, "limits": [usage_json(u) for u in found]})
