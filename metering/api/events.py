"""``POST /v1/events`` (queue, or decide with ``?wait=decision``) and
``GET /v1/events/{event_id}``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.auth import (
    hide_other_subjects,
    key_subject_of,
    may_read,
    not_found,
)
from metering.api.context import Context
from metering.api.models import (
    EVENT_ID_PATTERN,
    Accepted,
    Kept,
    Pending,
    Result,
    Results,
    result_json,
)
from metering.api.parsing import (
    IDEMPOTENCY_HEADER,
    body_kind,
    parse_events,
    queued_events,
    with_idempotency_key,
)
from metering.api.problems import ApiProblem
from metering.api.queueing import (
    FreeCharge,
    UnknownLimits,
    accept,
    apply_now,
    free_charge,
    unique_queued,
    unknown_limits,
)
from metering.api.routes import route
from metering.domain.events import Charge, validate_event_id
from metering.telemetry.metrics import count_received

router = APIRouter(prefix="/v1", tags=["events"])

_EVENT_SCHEMA = {
    "anyOf": [
        {"$ref": "#/components/schemas/SingleEvent"},
        {"$ref": "#/components/schemas/StackedEvent"},
    ]
}
_CLOUDEVENT_SCHEMA = {"$ref": "#/components/schemas/CloudEvent"}
IDEMPOTENCY_PARAMETER: dict[str, Any] = {
    "name": IDEMPOTENCY_HEADER,
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": f'^"?{EVENT_ID_PATTERN.strip("^$")}"?$'},
    "description": "The event id of a single plain event "
    "(draft-ietf-httpapi-idempotency-key-header; a Structured Field string such as "
    '"order-42", or the bare id). The header wins as the id: a body event_id is '
    "allowed only when equal to it (a different one is a 400 problem), and a batch or "
    "a CloudEvent with the header is a 400. A repeated key answers the stored result.",
}
EVENTS_BODY: dict[str, Any] = {
    "parameters": [IDEMPOTENCY_PARAMETER],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"anyOf": [_EVENT_SCHEMA, {"type": "array", "items": _EVENT_SCHEMA}]}
            },
            "application/cloudevents+json": {"schema": _CLOUDEVENT_SCHEMA},
            "application/cloudevents-batch+json": {
                "schema": {"type": "array", "items": _CLOUDEVENT_SCHEMA}
            },
        },
    },
}


@route(
    router.post,
    "/events",
    "Send usage events",
    scope="ingest",
    ok={
        202: {"model": Accepted, "description": "Queued: the broker has them."},
        200: {"model": Results, "description": "With ?wait=decision: each event's result."},
    },
    errors=(400, 409, 415, 422),
    status_code=202,
    openapi_extra=EVENTS_BODY,
)
async def post_events(
    request: Request,
    context: Context,
    wait: Annotated[
        Literal["decision"] | None,
        Query(description="decision: apply now and answer with the results."),
    ] = None,
) -> Response:
    """One event, a JSON array of events, or CloudEvents (structured or batch).

    Every event is validated before any is queued: one bad event refuses the
    request (400, each bad field named) and nothing is stored. Valid events
    go to the queue and the answer is 202 once the broker has them; an id
    decided before is answered with its stored result (``duplicates``), an
    id used before with other charges is a 409. ``?wait=decision`` applies
    them at once, in order, and answers with their results. An
    ``Idempotency-Key`` header names a single plain event's id. A key without
    ``read`` scope gets outcomes only: no used, remaining, maximum, overage,
    nor a token bucket's ``retry_at``; with ``?wait=decision`` an event of
    its that is denied when checked is not applied: nothing is recorded.
    """
    kind = body_kind(request.headers.get("content-type"))
    body = await request.body()
    # Read by hand (no FastAPI parameter to validate on every request): rare,
    # and the usual request is still parsed in one pass.
    idempotency_keys = request.headers.getlist(IDEMPOTENCY_HEADER)
    if idempotency_keys:
        body = with_idempotency_key(body, kind, idempotency_keys)
    now = context.meter.clock()
    if wait == "decision":
        parsed = parse_events(body, kind, now, context.settings.api_max_events)
        figures = await may_read(request)
        results = await apply_now(context.meter, parsed, record_denials=figures)
        pairs = zip(parsed, results, strict=True)
        _received({p.event.event_id: p.event.charges for p, d in pairs if not d.duplicate}.values())
        answers = [result_json(d, figures=figures) for d in results]
        return JSONResponse({"results": answers}, status_code=200)
    # The queued path: events validated straight into message text (`QueuedEvent`).
    unique = unique_queued(queued_events(body, kind, now, context.settings.api_max_events))
    figures = await may_read(request)
    try:
        fresh, stored = await to_thread.run_sync(
            accept, context.meter, context.producer, unique, limiter=context.ingest_limiter()
        )
    except UnknownLimits as exc:
        # Rare: parsed again, for the pointer to each charge at fault.
        parsed = parse_events(body, kind, now, context.settings.api_max_events)
        raise unknown_limits(parsed, exc.limits) from None
    except FreeCharge as exc:
        parsed = parse_events(body, kind, now, context.settings.api_max_events)
        raise free_charge(parsed, exc) from None
    if fresh:
        _received([event.charges for event in fresh])  # unique ids already
    accepted = {
        "accepted": [event.event_id for event in fresh],
        "duplicates": [
            result_json(stored[e.event_id].decision, figures=figures)
            for e in unique
            if e.event_id in stored
        ],
    }
    return JSONResponse(accepted, status_code=202)


def _received(events: Iterable[tuple[Charge, ...]]) -> None:
    """`metering_events_received_total`: new events (each id once, given by
    their charges), under each limit they charge."""
    names: list[str] = []
    for charges in events:
        if len(charges) == 1:
            names.append(charges[0][1])
        else:
            names.extend(dict.fromkeys(c[1] for c in charges))
    count_received(names)


@route(
    router.get,
    "/events/{event_id}",
    "An event's result",
    scope="read",
    subjects="route",
    ok={
        200: {
            "model": Result | Pending | Kept,
            "description": "The stored result; pending (queued); or kept by this server "
            "while the broker is unavailable.",
        }
    },
    errors=(400, 404),
)
async def get_event(
    request: Request,
    event_id: Annotated[
        str,
        # The schema documents the rule; `validate_event_id` enforces it.
        Path(description="The event id.", json_schema_extra={"pattern": EVENT_ID_PATTERN}),
    ],
    context: Context,
) -> Response:
    """The stored result of an event; ``pending`` while it is queued; ``kept``
    while this server holds it for a broker that was unavailable; 404 when unknown.
    A customer's key sees the decided events of its own subject only: any
    other, pending or kept, is 404."""
    validate_event_id(event_id)
    decision = await run_in_threadpool(context.meter.result, event_id)
    if await key_subject_of(request) is not None:
        if decision is None:
            raise not_found()
        await hide_other_subjects(request, (charge.subject for charge in decision.charges))
        return JSONResponse(result_json(decision))
    if decision is None:
        if event_id in await run_in_threadpool(lambda: context.producer.kept):
            return JSONResponse({"status": "kept", "event_id": event_id})
        if await run_in_threadpool(context.is_queued, event_id):
            return JSONResponse({"status": "pending", "event_id": event_id})
        # Not queued: a worker may have applied it since the first look.
        decision = await run_in_threadpool(context.meter.result, event_id)
    if decision is None:
        raise ApiProblem("not-found", f"no event {event_id!r} has been decided or is queued")
    return JSONResponse(result_json(decision))
