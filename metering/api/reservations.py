"""Reservations over HTTP: ``POST /v1/reservations``, ``GET /v1/reservations``,
``GET /v1/reservations/{id}``, ``POST /v1/reservations/{id}/cancel`` and ``/commit``.

A reservation is `Meter.reserve`: decided and recorded like an event, and
when allowed held until it is cancelled (the cost goes back), committed, or
past its time to live (the sweeper commits it). Reserving, cancelling and
committing are what a service does around the work it meters, so they take
the ``ingest`` scope; listing and reading reservations take ``read``.

A reservation id is an event id, which may hold ``/``: the id in the path
takes the rest of the path up to ``/cancel`` or ``/commit``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import (
    bad_field,
    fields_named,
    json_body,
    problem_schema,
    problem_with,
    read_object,
    threaded,
)
from metering.api.auth import key_subject_of, may_read, scoped_subject
from metering.api.context import Context
from metering.api.models import (
    EVENT_ID_PATTERN,
    LIMIT_PATTERN,
    DecisionOut,
    body_fields,
    decision_json,
    subject_field,
)
from metering.api.parsing import CHARGE_CHECKS, whole_number
from metering.api.problems import ApiProblem
from metering.api.queueing import denied_when_checked
from metering.api.routes import Handler, route
from metering.domain.decisions import Decision
from metering.domain.events import MAX_CHARGES, MAX_COST, Charge, make_event
from metering.domain.reservations import DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS
from metering.errors import InvalidInput, ReservationSettled, UnknownLimit, UnknownReservation
from metering.meter import Meter
from metering.reservations import ReservationInfo
from metering.reservations.transactions import validate_ttl

ReservationStateName = Literal["held", "committed", "cancelled"]


class ReserveCharge(BaseModel):
    """One charge of a stacked reservation."""

    model_config = ConfigDict(extra="forbid")

    subject: str = subject_field()
    limit: str = Field(pattern=LIMIT_PATTERN, examples=["exports"])
    cost: int = Field(default=1, ge=1, le=MAX_COST)


def _reservation_id() -> Any:
    return Field(
        default=None,
        pattern=EVENT_ID_PATTERN,
        description="The reservation's id (its event id): a repeated id answers the "
        "same reservation. Generated when not given.",
    )


def _ttl() -> Any:
    return Field(
        default=DEFAULT_TTL_SECONDS,
        gt=0,
        le=MAX_TTL_SECONDS,
        description="Seconds it is held before the sweeper commits it (at most 7 days).",
    )


class ReserveSingle(BaseModel):
    """Reserve one charge: consumed now, given back by a cancel."""

    model_config = ConfigDict(extra="forbid")

    event_id: str | None = _reservation_id()
    subject: str = subject_field()
    limit: str = Field(pattern=LIMIT_PATTERN, examples=["exports"])
    cost: int = Field(default=1, ge=1, le=MAX_COST)
    ttl_seconds: float = _ttl()
    metadata: dict[str, Any] | None = Field(default=None, description="At most 8 KiB as JSON.")


class ReserveStacked(BaseModel):
    """Reserve several charges, all or nothing."""

    model_config = ConfigDict(extra="forbid")

    event_id: str | None = _reservation_id()
    charges: list[ReserveCharge] = Field(min_length=1, max_length=MAX_CHARGES)
    ttl_seconds: float = _ttl()
    metadata: dict[str, Any] | None = Field(default=None, description="At most 8 KiB as JSON.")


class ReservedCharge(BaseModel):
    subject: str
    limit: str
    cost: int = Field(description="The units reserved.")
    given_back: int = Field(
        description="The units that went back to the counter: by a cancel, a void, or a "
        "commit of less than reserved (`actual`)."
    )


class ReservationOut(BaseModel):
    """A stored reservation."""

    id: str
    state: ReservationStateName
    charges: list[ReservedCharge]
    created_at: datetime
    expires_at: datetime = Field(description="When the sweeper commits it if still held.")
    settled_at: datetime | None
    settled_by: str | None = Field(
        description="cancel, commit, expiry or void.", examples=["cancel"]
    )


class Cancelled(ReservationOut):
    """A cancelled reservation, and the units its counters took back."""

    returned: int = Field(
        description="Units given back: 0 when a window has ended since, or on a second cancel."
    )


class Committed(ReservationOut):
    """A committed reservation, and the units given back by a commit of less."""

    returned: int = Field(
        description="Units given back: the reserved cost less ``actual``, where the counters "
        "could take it (with the minor units of money priced units gave back); 0 without "
        "``actual`` or on a second commit."
    )


class Reservations(BaseModel):
    reservations: list[ReservationOut] = Field(description="Newest first.")


class Reserved(BaseModel):
    """The answer to a reservation: its state, and the decision."""

    id: str
    state: Literal["held", "committed", "cancelled", "denied"] = Field(
        description="held when allowed; denied (nothing consumed, nothing stored); for a "
        "repeated id, where the reservation stands now."
    )
    allowed: bool
    duplicate: bool = Field(description="The id had been decided before: this is that result.")
    expires_at: datetime | None = Field(description="When a held reservation is committed.")
    decision: DecisionOut


def reservation_json(info: ReservationInfo) -> dict[str, Any]:
    return info.to_dict()


# -- the routes ---------------------------------------------------------------------

router = APIRouter(prefix="/v1", tags=["reservations"])

# A listing answers at most this many reservations.
MAX_LISTED: Final = 1000
RESERVE_FIELDS: Final = body_fields(ReserveSingle, ReserveStacked)
CHARGE_FIELDS: Final = body_fields(ReserveCharge)
ID_NAMES: Final = {"event_id": "reservation_id"}

SETTLED_409: Final = problem_schema(
    "The reservation is already settled (state: where it stands); a cancel past its "
    "time to live commits it and answers this with state committed.",
    state={"type": "string", "enum": ["held", "committed", "cancelled"]},
)

ReservationId = Annotated[
    str,
    Path(
        pattern=EVENT_ID_PATTERN,
        description="The reservation's id (its event id; it may hold /).",
        examples=["export-7781"],
    ),
]


@route(
    router.post,
    "/reservations",
    "Reserve: consume now, give back later",
    scope="ingest",
    ok={200: {"model": Reserved, "description": "Held (allowed), or denied: the decision."}},
    errors=(400, 409, 415, 422),
    openapi_extra=json_body(ReserveSingle, ReserveStacked),
)
async def reserve(request: Request, context: Context) -> Response:
    """Decide and record the charges like an event; when allowed, hold them
    until ``/cancel`` gives the cost back or ``/commit`` (or the time to live)
    makes it final. A denied reservation consumes and stores nothing (for a
    key that may only ingest, one denied when checked records no denial
    either, and notifies nobody).

    ``event_id`` is the reservation's id: a repeated id answers the same
    reservation as it stands now (``duplicate``); the same id with other
    charges is a 409. A key without ``read`` scope gets the decision's
    outcome only: no used, remaining, maximum, overage.
    """
    item = await read_object(request, RESERVE_FIELDS)
    ttl = item.pop("ttl_seconds", DEFAULT_TTL_SECONDS)
    with fields_named():
        ttl = validate_ttl(ttl)
    charges = _charges(item)
    with fields_named():
        event = make_event(
            charges, context.meter.clock(), item.get("event_id"), item.get("metadata")
        )
    figures = await may_read(request)
    try:
        denied = (
            {} if figures else await run_in_threadpool(denied_when_checked, context.meter, [event])
        )
        if event.event_id in denied:
            return JSONResponse(_denied(denied[event.event_id]))
        reservation = await run_in_threadpool(
            lambda: context.meter.reserve(
                charges=event.charges,
                event_id=event.event_id,
                ttl_seconds=ttl,
                metadata=event.metadata,
            )
        )
    except UnknownLimit as exc:
        pointer = "limit" if "charges" not in item else _charge_pointer(event.charges, exc.limit)
        raise ApiProblem("unknown-limit", str(exc), [(pointer, str(exc))]) from None
    body = {
        "id": reservation.id,
        "state": str(reservation.state),
        "allowed": reservation.allowed,
        "duplicate": reservation.decision.duplicate,
        "expires_at": reservation.expires_at.isoformat() if reservation.expires_at else None,
        "decision": decision_json(reservation.decision, figures=figures),
    }
    return JSONResponse(body)


def _denied(decision: Decision) -> dict[str, Any]:
    """The answer to a key that may only ingest, for a reservation denied when
    checked: what a denied reservation answers, outcomes only; nothing stored."""
    return {
        "id": decision.event_id,
        "state": "denied",
        "allowed": False,
        "duplicate": False,
        "expires_at": None,
        "decision": decision_json(decision, figures=False),
    }


def _charges(item: dict[str, Any]) -> list[Charge]:
    """One charge (``subject``, ``limit``, ``cost``) or ``charges``, each field
    checked by the library's validators and named where it was given."""
    if "charges" in item:
        if any(name in item for name in CHARGE_FIELDS):
            raise bad_field("charges", "give subject and limit, or charges, not both")
        given = item["charges"]
        if not isinstance(given, list) or not given:
            raise bad_field("charges", "must be a non-empty array of {subject, limit, cost}")
        return [_charge(charge, f"charges[{index}].") for index, charge in enumerate(given)]
    for name in ("subject", "limit"):
        if name not in item:
            raise bad_field(name, "is required (or give charges)")
    return [_charge({k: v for k, v in item.items() if k in CHARGE_FIELDS}, "")]


def _charge(given: object, prefix: str) -> Charge:
    if not isinstance(given, dict):
        raise bad_field(prefix.rstrip("."), "must be an object with subject, limit and cost")
    for key in given:
        if key not in CHARGE_FIELDS:
            raise bad_field(prefix + str(key)[:60], "is not a field of a charge")
    values: list[Any] = []
    for name, check in CHARGE_CHECKS:
        value = given.get(name, 1 if name == "cost" else None)
        try:
            values.append(check(whole_number(value) if name == "cost" else value))
        except InvalidInput as exc:
            raise bad_field(prefix + name, exc.message) from None
    return Charge(*values)


def _charge_pointer(charges: tuple[Charge, ...], limit: str) -> str:
    for index, charge in enumerate(charges):
        if charge.limit == limit:
            return f"charges[{index}].limit"
    return "charges"


@route(
    router.get,
    "/reservations",
    "The newest reservations",
    scope="read",
    subjects="query",
    ok={200: {"model": Reservations, "description": "Newest first."}},
    errors=(400,),
)
async def list_reservations(
    request: Request,
    context: Context,
    state: Annotated[
        Literal["held", "committed", "cancelled"] | None, Query(description="Only this state.")
    ] = None,
    subject: Annotated[
        str | None, Query(description="Only reservations charging this subject.")
    ] = None,
    count: Annotated[int, Query(ge=1, le=MAX_LISTED, description="How many, newest first.")] = 100,
) -> Response:
    """The ``count`` newest reservations (at most 1000), optionally of one state
    and one subject: what ``metering reservations list`` shows. A customer's
    key gets its own subject's, and none that charges another subject too."""
    subject = await scoped_subject(request, subject)
    found = await threaded(context.meter.reservations, state, subject, count)
    if await key_subject_of(request) is not None:
        found = [r for r in found if all(c.subject == subject for c in r.charges)]
    return JSONResponse({"reservations": [r.to_dict() for r in found]})


@route(
    router.get,
    "/reservations/{reservation_id:path}",
    "A reservation",
    scope="read",
    ok={200: {"model": ReservationOut, "description": "Where it stands."}},
    errors=(400, 404),
)
async def get_reservation(reservation_id: ReservationId, context: Context) -> Response:
    """A stored reservation; 404 for an id never reserved (or denied: nothing is stored)."""
    return JSONResponse(reservation_json(await _stored(context.meter, reservation_id)))


async def _stored(meter: Meter, reservation_id: str) -> ReservationInfo:
    info = await threaded(meter.reservation, reservation_id, names=ID_NAMES)
    if info is None:
        raise UnknownReservation(reservation_id)
    return info


async def _settle(meter: Meter, reservation_id: str, settle: Callable[[], int]) -> Response:
    """``settle()`` (a cancel or a commit: the units it gave back) and the
    reservation as it is then, or a 409 with the ``state`` it is in."""
    try:
        returned = await threaded(settle, names=ID_NAMES)
    except ReservationSettled as exc:  # ReservationExpired too
        return problem_with("reservation-settled", str(exc), state=str(exc.state))
    info = await _stored(meter, reservation_id)
    return JSONResponse({**reservation_json(info), "returned": returned})


def _settle_route(
    action: str, summary: str, model: type[BaseModel], description: str
) -> Callable[[Handler], Handler]:
    """``POST /v1/reservations/{id}/{action}``: the ``ingest`` scope; 409 when settled."""
    return route(
        router.post,
        f"/reservations/{{reservation_id:path}}/{action}",
        summary,
        scope="ingest",
        ok={200: {"model": model, "description": description}},
        errors=(400, 404),
        more={409: SETTLED_409},
    )


@_settle_route(
    "cancel",
    "Cancel: give the cost back",
    Cancelled,
    "Cancelled (a second cancel changes nothing).",
)
async def cancel(reservation_id: ReservationId, context: Context) -> Response:
    """Give a held reservation's cost back where its counters can still take it
    (``returned``); a second cancel does nothing. 409 when it is committed,
    with ``state``; past its time to live it is committed now and the answer
    is that 409 (``state: committed``): the usage stands."""
    settle = partial(context.meter.cancel_reservation, reservation_id)
    return await _settle(context.meter, reservation_id, settle)


@_settle_route(
    "commit",
    "Commit: make the usage final, at the actual amount if given",
    Committed,
    "Committed (again: no change).",
)
async def commit(
    reservation_id: ReservationId,
    context: Context,
    actual: Annotated[
        int | None,
        Query(
            ge=0,
            le=MAX_COST,
            description="What the work really used, in units: each charge is settled at "
            "this amount. Below its reserved cost the rest goes back once (``returned``), "
            "with the money of priced units (a priced charge keeps the price of the first "
            "units it reserved); above it the excess is charged once, past a hard limit as "
            "overdraft (billed; see the event's result and the overage report), but for "
            "priced usage, refused (400). docs/money.md.",
        ),
    ] = None,
) -> Response:
    """Make a held reservation final; committing twice does nothing; 409 after a
    cancel (``state: cancelled``). With ``actual`` below the reserved cost the
    rest goes back; past the time to live that is a 409 (``state:
    committed``): the whole cost stands. More than reserved charges the excess
    (also after the sweeper's commit, once)."""
    settle = partial(context.meter.commit_reservation, reservation_id, actual)
    return await _settle(context.meter, reservation_id, settle)
