"""The API meters itself: each API key's requests against one limit.

`PerKeyRate` wraps the project's own `MeteringMiddleware` around the
routes: every request made with a valid key is charged, as one unit, to
subject ``apikey:<id>`` of the limit ``metering.api.requests``, a token
bucket of ``METERING_API_RATE`` (default ``6000/1m``: bursts of 6000, 100 a
second sustained). A key past it gets 429 (a problem, with ``Retry-After``
and the ``RateLimit`` headers) while other keys go on; a charge that cannot
be made (the database down) is answered the problem a route answers for
its error. Requests without a valid key are not charged (they are refused,
or the API is open).

`define_rate_limit` writes the limit at startup from the setting, through
`Meter.set_product_limit`: the name is reserved (``metering.*``), so the
API, the CLI and `Meter.set_limit` refuse to change or delete it.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any, Final

from metering.api.auth import STATE_KEY, ASGIApp, Receive, Send, key_subject
from metering.api.problems import PROBLEM_JSON, problem_body, translate
from metering.domain.decisions import Decision
from metering.domain.limits import Limit
from metering.errors import MeteringError, UnknownLimit
from metering.meter import Meter
from metering.middleware import MeteringMiddleware, RequestInfo
from metering.middleware.core import DeniedResponse
from metering.settings import ApiRate

RATE_LIMIT: Final = "metering.api.requests"


def rate_limit(rate: ApiRate) -> Limit:
    return Limit(RATE_LIMIT, maximum=rate.maximum, period=rate.period, algorithm="token_bucket")


def define_rate_limit(meter: Meter, rate: ApiRate | None) -> None:
    """Store the API's limit as the setting says (unchanged: no write)."""
    if rate is None:
        return
    wanted = rate_limit(rate)
    try:
        if meter.get_limit(RATE_LIMIT) == wanted:
            return
    except UnknownLimit:
        pass
    meter.set_product_limit(wanted)


def _key(request: RequestInfo) -> str | None:
    state = request.raw.get("state") or {}
    return key_subject(state.get(STATE_KEY))


def too_many(_request: RequestInfo, _decision: Decision, retry_after: int) -> DeniedResponse:
    """429 as a problem; the middleware adds ``Retry-After`` and ``RateLimit``."""
    plural = "" if retry_after == 1 else "s"
    body = problem_body(
        "rate-limited",
        f"this API key sent too many requests: retry after {retry_after} second{plural}",
    )
    return DeniedResponse(429, [("content-type", PROBLEM_JSON)], json.dumps(body).encode())


def unavailable(_request: RequestInfo, error: MeteringError) -> DeniedResponse:
    """No decision (the database is down): the problem of ``error``, as a route answers it."""
    slug, detail, errors, extra = translate(error)
    body = problem_body(slug, detail, errors, **extra)
    headers = [("content-type", PROBLEM_JSON)]
    if body["status"] == 503:
        headers.append(("retry-after", "5"))
    return DeniedResponse(body["status"], headers, json.dumps(body).encode())


class PerKeyRate:
    """`MeteringMiddleware` per API key, on the meter ``create_api`` opens.

    The meter exists only once the app has started (its lifespan), so the
    metering middleware is made on the first request.
    """

    def __init__(self, app: ASGIApp, *, rate: ApiRate | None) -> None:
        self.app = app
        self.rate = rate
        self._metered: MeteringMiddleware | None = None

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if self.rate is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if key_subject((scope.get("state") or {}).get(STATE_KEY)) is None:
            # No valid key: nothing to charge (what `_key` tells the middleware).
            await self.app(scope, receive, send)
            return
        if self._metered is None:
            meter: Meter = scope["app"].state.metering.meter
            self._metered = MeteringMiddleware(
                self.app,
                meter=meter,
                limit=RATE_LIMIT,
                key=_key,
                on_denied=too_many,
                on_unavailable=unavailable,
            )
        await self._metered(scope, receive, send)
