"""``GET /portal``: a customer's usage page (`metering.usage.portal`, docs/portal.md).

Opened with a customer's key (``Authorization: Bearer mk_...`` of a key made
with ``--subject``) or a signed link (``?token=`` from ``metering portal
link``); never an API key in the URL. A key of no subject, a bad or expired
link: 401, and the page says nothing of any subject: an HTML page for a
browser (``Accept: text/html``), a problem for any other client.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, Response

from metering.api.auth import BEARER, REALM, identity_of
from metering.api.context import ApiContext, api_context
from metering.api.problems import COMMON_ERRORS, ApiProblem, responses
from metering.usage.portal import portal_view, render_page, render_refusal, subject_of_link

router = APIRouter(tags=["portal"])
# A browser's 401 is a page; any other client's a problem.
REFUSED: Final = responses(401)
REFUSED[401]["content"]["text/html"] = {}

# The page runs no script and loads nothing; the link's token stays out of
# referrers and caches.
HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


def _refusal(request: Request, detail: str) -> Response:
    """401: a page for a browser, a problem for any other client."""
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(
            render_refusal(detail),
            status_code=401,
            headers={**HEADERS, "WWW-Authenticate": REALM},
        )
    raise ApiProblem("unauthorized", detail, headers={"WWW-Authenticate": REALM})


@router.get(
    "/portal",
    summary="A customer's usage page (HTML)",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {}}, "description": "The page."},
        **REFUSED,
        **responses(*COMMON_ERRORS),
    },
    # A customer's key, or no key at all with a signed link's ``token``.
    openapi_extra={"security": [{BEARER: ["read"]}, {}]},
)
async def portal(
    request: Request,
    context: Annotated[ApiContext, Depends(api_context)],
    token: Annotated[
        str | None, Query(description="A signed link's token (`metering portal link`).")
    ] = None,
) -> Response:
    """One subject's usage: each limit's use against its maximum now, when it
    resets, grants left, the last 30 days, and recent denials."""
    database = context.meter.database
    if token is not None:
        subject = await run_in_threadpool(subject_of_link, database, token)
        if subject is None:
            return _refusal(request, "the link is not valid or has expired: ask for a new one")
    else:
        identity = await identity_of(request)
        if identity.error is not None:
            raise identity.error
        key = identity.key
        if key is None or key.subject is None:
            return _refusal(
                request,
                "the usage page needs a customer's key (Authorization: Bearer of a key "
                "made with --subject) or a signed link (metering portal link)",
            )
        subject = key.subject
    view = await run_in_threadpool(portal_view, database, subject)
    return HTMLResponse(render_page(view), headers=HEADERS)
