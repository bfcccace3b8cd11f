"""ASGI middleware (Starlette, FastAPI and any ASGI application).

    app.add_middleware(MeteringMiddleware, meter=meter, limit="api", key=authenticated_user)

Starlette runs the middleware added *last* outermost. A plain limit awaits
`Meter.aconsume` (shared transactions, no thread held per request); a
stacking limit's reservations run in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from metering.domain.reservations import ReservationState
from metering.middleware.core import (
    DeniedResponse,
    Middleware,
    RequestInfo,
    RequestMetering,
    Step,
)
from metering.reservations.leases import LeasedReservation

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def request_info(scope: Scope) -> RequestInfo:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    client = scope.get("client")
    return RequestInfo(
        method=scope.get("method", "GET"),
        path=scope.get("path", "/"),
        headers=headers,
        client=client[0] if client else None,
        user=scope.get("user"),
        raw=scope,
    )


def context_of(scope: Scope) -> RequestMetering:
    """The request's `RequestMetering`, in ``scope["state"]`` (``request.state.metering``)."""
    state = scope.setdefault("state", {})
    context = state.get("metering")
    if not isinstance(context, RequestMetering):
        context = state["metering"] = RequestMetering()
    return context


async def send_response(send: Send, response: DeniedResponse) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": _encode(response.headers),
        }
    )
    await send({"type": "http.response.body", "body": response.body})


def _encode(headers: Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


class MeteringMiddleware(Middleware[ASGIApp]):
    """Charge each HTTP request to a limit; answer 429 with ``Retry-After`` when denied.

    ``key`` picks the subject (default: `client_ip()` trusting no proxy); a
    request whose key is None is not charged here. ``routes`` change the
    limit or cost per route, or exempt routes. ``stacking=True`` makes this
    an outer limit that a limit further in replaces (see
    `metering.middleware.core`). ``headers`` adds ``RateLimit`` and
    ``RateLimit-Policy`` to every response; ``on_denied(request, decision,
    retry_after)`` builds your own refusal; ``fail_open`` lets requests
    through uncharged (instead of 503) while no decision can be made: the
    database is unreachable, or the limit was deleted while the app runs;
    ``on_unavailable(request, error)`` builds that 503 yourself.
    ``leases`` (default True) decides a key that is hot in this process from
    a block of units leased by the meter (`metering.reservations.leases`), in memory;
    ``leases=False`` sends every request to the database. The leases are
    settled at the application's lifespan shutdown.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._settling_at_shutdown(receive), send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = context_of(scope)
        step = await self.policy.aenter(request_info(scope), context)
        if step.response is not None:
            await send_response(send, step.response)
            return
        if step.applied is None:
            await self.app(scope, receive, send)
            return

        reservation = step.applied.reservation

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Every limit further in has decided by now: settle before
                # the client sees the answer.
                if reservation is not None and reservation.state == ReservationState.HELD:
                    await self._leave(step)
                extra = self.policy.response_headers(step, context)
                if extra:
                    message = {**message, "headers": [*message.get("headers", ()), *_encode(extra)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            if reservation is not None and reservation.state == ReservationState.HELD:
                await self._leave(step)

    async def _leave(self, step: Step) -> None:
        """Settle the request's reservation: in memory if from a lease, else
        in a thread (a transaction)."""
        applied = step.applied
        if applied is not None and isinstance(applied.reservation, LeasedReservation):
            self.policy.leave(step)
        else:
            await asyncio.to_thread(self.policy.leave, step)

    def _settling_at_shutdown(self, receive: Receive) -> Receive:
        """``receive`` for the lifespan: at shutdown, settle this meter's
        leases (their unused units go back) before the application stops."""

        async def receiving() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.shutdown" and self.policy.leases:
                await asyncio.to_thread(self.policy.meter.settle_leases, everything=True)
            return message

        return receiving
