"""Problem details (RFC 9457) for every error the API answers, and the one
place where `metering.errors` become HTTP statuses.

Every 4xx and 5xx body is ``application/problem+json``: ``type`` (a URN
naming the kind of problem), ``title`` (the same for every problem of a
type), ``status``, ``detail`` (this occurrence), and, for bad input,
``errors``: one ``{"field", "message"}`` per field at fault, the field a
pointer into the request (``events[3].cost``, ``data.limit``, ``subject``).
Some types carry one more member: ``event_ids`` (409, 503) and ``kept``
(503, events the server holds and will still queue).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import starlette.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from metering.errors import (
    BrokerUnavailable,
    CheckoutConflict,
    CheckoutReleased,
    ConfigurationError,
    CorrectionConflict,
    CorrectionRefused,
    DatabaseUnavailable,
    EventConflict,
    GrantConflict,
    InputRefused,
    InvalidInput,
    MeteringError,
    NotQuarantined,
    ReservationSettled,
    ReservedLimit,
    SchemaOutdated,
    UnknownApiKey,
    UnknownCheckout,
    UnknownEvent,
    UnknownLimit,
    UnknownReservation,
    UnknownWebhookEndpoint,
)

log = logging.getLogger(__name__)

PROBLEM_JSON: Final = "application/problem+json"
TYPE_PREFIX: Final = "urn:metering:problem:"

# slug -> (status, title): the problem types this API answers with.
TYPES: Final[dict[str, tuple[int, str]]] = {
    "invalid-input": (400, "The request is not valid"),
    "unauthorized": (401, "No valid API key"),
    "forbidden": (403, "The API key lacks the scope"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "not-acceptable": (406, "Not acceptable"),
    "conflict": (409, "An event id was already used with other charges"),
    "reservation-settled": (409, "The reservation is already settled"),
    "checkout-released": (409, "The checkout has ended"),
    "checkout-conflict": (409, "A checkout id was already used with other values"),
    "grant-conflict": (409, "A grant id was already used with other values"),
    "correction-conflict": (409, "A correction id already voids another event"),
    "correction-refused": (409, "The event cannot be voided"),
    "reserved-limit": (409, "The limit belongs to the product"),
    "request-timeout": (408, "The request body did not arrive in time"),
    "body-too-large": (413, "The request is too large"),
    "unsupported-media-type": (415, "Unsupported content type"),
    "unknown-limit": (422, "A charge names an unknown limit"),
    "input-refused": (422, "The database refused the data"),
    "rate-limited": (429, "Too many requests"),
    "internal-error": (500, "Internal server error"),
    "configuration-error": (500, "The server is misconfigured"),
    "broker-unavailable": (503, "The queue is unavailable"),
    "database-unavailable": (503, "The database is unavailable"),
}


class FieldError(BaseModel):
    """One field at fault: a pointer into the request, and what is wrong with it."""

    field: str = Field(examples=["events[3].cost"])
    message: str = Field(examples=["must be between 1 and 1000000000000, got 0"])


class Problem(BaseModel):
    """An error, as RFC 9457 problem details (``application/problem+json``)."""

    type: str = Field(examples=["urn:metering:problem:invalid-input"])
    title: str
    status: int = Field(ge=400, le=599)
    detail: str
    errors: list[FieldError] | None = None
    event_ids: list[str] | None = Field(
        default=None, description="409: the conflicting ids; 503: the ids of this request."
    )
    kept: list[str] | None = Field(
        default=None,
        description="503: ids the server holds and will still queue: never send them again "
        "under new ids (sending the same ids again is safe).",
    )


@dataclass
class ApiProblem(Exception):
    """Raised by a route to answer with a problem of type ``slug``."""

    slug: str
    detail: str
    errors: Sequence[tuple[str, str]] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] | None = None

    def __post_init__(self) -> None:
        super().__init__(self.detail)

    @property
    def status(self) -> int:
        return TYPES[self.slug][0]


def problem_body(
    slug: str, detail: str, errors: Sequence[tuple[str, str]] = (), **extra: Any
) -> dict[str, Any]:
    status, title = TYPES[slug]
    body: dict[str, Any] = {
        "type": TYPE_PREFIX + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if errors:
        body["errors"] = [{"field": f, "message": m} for f, m in errors]
    body.update({k: list(v) for k, v in extra.items() if v is not None})
    return body


def problem_response(
    slug: str,
    detail: str,
    errors: Sequence[tuple[str, str]] = (),
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    body = problem_body(slug, detail, errors, **extra)
    return JSONResponse(body, body["status"], headers=headers, media_type=PROBLEM_JSON)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: the problem model under each status it may answer."""
    return {
        status: {
            "description": _description(status),
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


def _description(status: int) -> str:
    titles = sorted({title for s, title in TYPES.values() if s == status})
    return "; ".join(titles) or "Error"


# Every route may answer these: a body too slow or past the bound, a database
# or broker that is down, a bug. Routes add their own.
COMMON_ERRORS: Final = (408, 413, 500, 503)


def translate(error: MeteringError) -> tuple[str, str, list[tuple[str, str]], dict[str, Any]]:
    """(slug, detail, field errors, extra members) of a library error: the one edge."""
    detail = str(error)
    if isinstance(error, InvalidInput):
        return "invalid-input", detail, [(error.field, error.message)], {}
    if isinstance(error, UnknownLimit):
        return "unknown-limit", detail, [("limit", detail)], {}
    if isinstance(error, EventConflict):
        return "conflict", detail, [], {"event_ids": [error.event_id]}
    if isinstance(
        error,
        UnknownReservation
        | UnknownWebhookEndpoint
        | UnknownApiKey
        | UnknownEvent
        | UnknownCheckout
        | NotQuarantined,
    ):
        return "not-found", detail, [], {}
    if isinstance(error, ReservationSettled):
        return "reservation-settled", detail, [], {}
    if isinstance(error, CheckoutReleased):
        return "checkout-released", detail, [], {}
    if isinstance(error, CheckoutConflict):
        return "checkout-conflict", detail, [("checkout_id", detail)], {}
    # A grant or correction id reused for something else, and a void of an
    # event that consumed nothing (or is past the horizon), conflict with what
    # is stored, as a cancel of a committed reservation does: 409, not 422.
    if isinstance(error, GrantConflict):
        return "grant-conflict", detail, [("grant_id", detail)], {}
    if isinstance(error, CorrectionConflict):
        return "correction-conflict", detail, [("correction_id", detail)], {}
    if isinstance(error, ReservedLimit):
        return "reserved-limit", detail, [("name", detail)], {}
    if isinstance(error, CorrectionRefused):
        return "correction-refused", detail, [("event_id", error.reason)], {}
    if isinstance(error, BrokerUnavailable):
        return "broker-unavailable", error.reason, [], {"kept": list(error.kept)}
    if isinstance(error, DatabaseUnavailable | SchemaOutdated):
        return "database-unavailable", detail, [], {}
    if isinstance(error, InputRefused):
        return "input-refused", detail, [], {}
    if isinstance(error, ConfigurationError):
        return "configuration-error", detail, [], {}
    return "internal-error", "the server could not complete the request", [], {}


async def _metering_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, MeteringError)
    slug, detail, errors, extra = translate(exc)
    if TYPES[slug][0] >= 500:
        log.warning("%s: %s", type(exc).__name__, exc)
    return problem_response(slug, detail, errors, **extra)


async def _api_problem(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiProblem)
    return problem_response(exc.slug, exc.detail, exc.errors, headers=exc.headers, **exc.extra)


_HTTP_SLUGS: Final = {
    400: "invalid-input",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    406: "not-acceptable",
    408: "request-timeout",
    413: "body-too-large",
    415: "unsupported-media-type",
    429: "rate-limited",
}


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, starlette.exceptions.HTTPException)
    slug = _HTTP_SLUGS.get(exc.status_code, "internal-error")
    detail = exc.detail if isinstance(exc.detail, str) else TYPES[slug][1]
    return problem_response(slug, detail, headers=exc.headers)


async def _validation_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [(_location(e.get("loc", ())), str(e.get("msg", "invalid"))) for e in exc.errors()]
    return problem_response("invalid-input", "the request is not valid", errors)


def _location(loc: Sequence[Any]) -> str:
    """FastAPI's ``("query", "wait")`` as ``wait``; ``("path", "id")`` as ``id``."""
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "query", "path") else loc
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) or str(part).isdigit() else f".{part}"
    return text.lstrip(".") or "body"


async def _client_gone(_request: Request, _exc: Exception) -> Response:
    # The client closed the connection before its body was read: nobody reads
    # this answer, and it is no server error to log.
    return problem_response("invalid-input", "the client disconnected before the body was read")


async def _unexpected(_request: Request, _exc: Exception) -> Response:
    # Starlette raises the exception again after this answer: the server logs it.
    return problem_response("internal-error", "the server could not complete the request")


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` with a problem: the translation's one edge."""
    app.add_exception_handler(MeteringError, _metering_error)
    app.add_exception_handler(ApiProblem, _api_problem)
    app.add_exception_handler(starlette.exceptions.HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)
