"""Quarantines of the runaway breaker over HTTP (docs/breaker.md).

``GET /v1/quarantines`` (``read``) lists the subjects a limit's breaker
holds; ``POST /v1/quarantines/{limit}/{subject}/release`` (``admin``) ends
one (404 when it is not quarantined). The ``limit.quarantined`` webhook's
``release_path`` (``release_url`` under ``METERING_PUBLIC_URL``) is
``/quarantine/release?token=...``, a signed link that needs no key:
``GET`` shows a page with a button ``POST``ing it to the same path, which
releases that quarantine (a link preview opening it changes nothing). A
forged, expired or used link: 401, a page for a browser, else a problem.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Annotated, Final
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse, Response

from metering.api.admin_common import threaded
from metering.api.auth import REALM
from metering.api.context import ApiContext, Context, api_context
from metering.api.models import LIMIT_PATTERN, SUBJECT_PATTERN
from metering.api.problems import COMMON_ERRORS, ApiProblem, responses
from metering.api.routes import route
from metering.domain.events import MAX_SUBJECT_LENGTH
from metering.errors import UnknownLimit
from metering.limits.quarantine import release_by_token, verified_link

router = APIRouter(tags=["quarantines"])

REFUSED: Final = responses(401)
REFUSED[401]["content"]["text/html"] = {}
HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
INVALID: Final = "the release link is not valid, has expired or was used"
Token = Annotated[
    str | None,
    Query(max_length=2000, description="The token of a limit.quarantined release link."),
]


class QuarantineOut(BaseModel):
    limit: str
    subject: str
    quarantined_at: datetime = Field(description="When its breaker tripped.")


class Quarantines(BaseModel):
    quarantines: list[QuarantineOut]


@route(
    router.get,
    "/v1/quarantines",
    "Quarantined subjects",
    scope="read",
    ok={200: {"model": Quarantines, "description": "By limit, then subject."}},
)
async def list_quarantines(context: Context) -> Response:
    """Every subject a limit's breaker holds to its quarantine maximum."""
    found = await threaded(context.meter.quarantines)
    return JSONResponse({"quarantines": [item.to_dict() for item in found]})


@route(
    router.post,
    "/v1/quarantines/{limit}/{subject:path}/release",
    "Release a quarantined subject",
    scope="admin",
    ok={200: {"model": QuarantineOut, "description": "The quarantine that ended."}},
    errors=(400, 404),
)
async def release_quarantine(
    limit: Annotated[str, Path(pattern=LIMIT_PATTERN)],
    subject: Annotated[
        str, Path(json_schema_extra={"pattern": SUBJECT_PATTERN, "maxLength": MAX_SUBJECT_LENGTH})
    ],
    context: Context,
) -> Response:
    """End the subject's quarantine on the limit; its baseline history starts
    again. 404 when no such limit holds the subject."""
    try:
        found = await threaded(context.meter.release_quarantine, subject, limit)
    except UnknownLimit as exc:
        raise ApiProblem("not-found", str(exc)) from None
    return JSONResponse(found.to_dict())


def _no_token() -> ApiProblem:
    return ApiProblem("not-found", "a release link has a token: ?token=...")


def _refusal(request: Request) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        page = _page("Release link refused", f"<p>{INVALID}.</p>")
        return HTMLResponse(page, status_code=401, headers={**HEADERS, "WWW-Authenticate": REALM})
    raise ApiProblem("unauthorized", INVALID, headers={"WWW-Authenticate": REALM})


@router.get(
    "/quarantine/release",
    summary="A release link's page (HTML)",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {}}, "description": "The page, with its button."},
        **REFUSED,
        **responses(400, 404, *COMMON_ERRORS),
    },
    openapi_extra={"security": [{}]},
)
async def release_page(
    request: Request, context: Annotated[ApiContext, Depends(api_context)], token: Token = None
) -> Response:
    """What the link releases, and a button that does (nothing changes here)."""
    if token is None:
        raise _no_token()
    found = await run_in_threadpool(verified_link, context.meter.database, token)
    if found is None:
        return _refusal(request)
    # Relative: the page's own path, wherever a proxy serves it (METERING_PUBLIC_URL's path).
    action = f"?token={quote(token)}"
    body = (
        f"<p>{escape(found.subject)} is quarantined on {escape(found.limit)}.</p>"
        f'<form method="post" action="{escape(action)}">'
        '<button type="submit">Release</button></form>'
    )
    return HTMLResponse(_page("Release a quarantine", body), headers=HEADERS)


@router.post(
    "/quarantine/release",
    summary="Release by a signed link",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {}}, "description": "Released."},
        **REFUSED,
        **responses(400, 404, *COMMON_ERRORS),
    },
    openapi_extra={"security": [{}]},
)
async def release_by_link(
    request: Request, context: Annotated[ApiContext, Depends(api_context)], token: Token = None
) -> Response:
    """End the quarantine the link names (once)."""
    if token is None:
        raise _no_token()
    found = await run_in_threadpool(release_by_token, context.meter.database, token)
    if found is None:
        return _refusal(request)
    body = f"<p>{escape(found.subject)} is released on {escape(found.limit)}.</p>"
    return HTMLResponse(_page("Released", body), headers=HEADERS)


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title></head><body><main><h1>{title}</h1>{body}</main></body></html>\n"
    )
