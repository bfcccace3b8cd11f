"""What the ASGI and WSGI middlewares share: decisions, refusals, headers (docs/middleware.md).

One `Policy` per middleware: which limit, for which key (client IP, user, any function of
the request), at what cost per route. `Policy.enter` runs before the application and returns
a `Step`: a response to send instead (429, or 503 when the database is down), or go ahead.
A ``stacking=True`` policy *reserves* its charge up front (so concurrent requests cannot
slip past an exhausted outer limit) and leaves it in the request's `RequestMetering`; a
policy further in that allows the request cancels every reservation waiting there (charged
to the user, not the IP); one nobody cancelled is committed when the request ends. With
``leases=True`` a hot key is decided from its `Meter`'s lease (`metering.reservations.leases`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypedDict, TypeVar, Unpack

from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.events import validate_cost
from metering.domain.limits import Limit, validate_limit_name
from metering.domain.reservations import ReservationState
from metering.errors import InvalidInput, MeteringError, StorageError
from metering.meter import Meter
from metering.middleware.keys import Key, RequestInfo, client_ip, subject_of
from metering.middleware.routes import Route, canonical_path
from metering.reservations import Reservation
from metering.reservations.leases import LeasedReservation

__all__ = [
    "Applied",
    "DeniedResponse",
    "Key",
    "Middleware",
    "Policy",
    "PolicyOptions",
    "RequestInfo",
    "RequestMetering",
    "Route",
    "Step",
    "retry_after_seconds",
]

log = logging.getLogger("metering.middleware")
LIMIT_CACHE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class DeniedResponse:
    """A response to send instead of calling the application."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


DeniedBuilder = Callable[[RequestInfo, Decision, int], DeniedResponse]
UndecidedBuilder = Callable[[RequestInfo, MeteringError], DeniedResponse]


@dataclass
class Applied:
    """One middleware's charge on a request."""

    limit: str
    subject: str
    decision: Decision
    reservation: Reservation | LeasedReservation | None = None


@dataclass
class RequestMetering:
    """Attached to each request (ASGI ``request.state.metering``, WSGI
    ``environ["metering"]``): every charge made, and the one that counts."""

    applied: list[Applied] = field(default_factory=list)
    pending: list[Applied] = field(default_factory=list)
    effective: Applied | None = None

    @property
    def decision(self) -> Decision | None:
        """The decision that governed the request (the innermost limit applied)."""
        return self.effective.decision if self.effective else None


@dataclass(frozen=True, slots=True)
class Step:
    """`Policy.enter`'s answer: a response to send, or go on (``applied`` may be None)."""

    response: DeniedResponse | None = None
    applied: Applied | None = None


# -- responses ------------------------------------------------------------------


def _seconds_until(moment_us: int | None, now_us: int) -> int:
    if moment_us is None:
        return 0
    return max(math.ceil((moment_us - now_us) / 1_000_000), 0)


def retry_after_seconds(decision: Decision, now_us: int) -> int:
    """Whole seconds until the denied charges fit again (at least 1)."""
    denied = [c for c in decision.charges if not c.allowed] or list(decision.charges)
    moments = [c.retry_at_us if c.retry_at_us is not None else c.resets_at_us for c in denied]
    return max(max((_seconds_until(m, now_us) for m in moments), default=1), 1)


def default_denied(_request: RequestInfo, decision: Decision, retry_after: int) -> DeniedResponse:
    """429 with a JSON body naming the limit and when to retry."""
    main = next((c for c in decision.charges if not c.allowed), None)
    body = {
        "error": "rate_limited",
        "message": "Too many requests: retry after "
        f"{retry_after} second{'' if retry_after == 1 else 's'}.",
        "denied_by": list(decision.denied_by),
        "limit": main.limit if main else None,
        "maximum": main.maximum if main else None,
        "retry_after": retry_after,
        "retry_at": decision.retry_at.isoformat() if decision.retry_at else None,
    }
    return DeniedResponse(429, [("content-type", "application/json")], json.dumps(body).encode())


def default_unavailable(_request: RequestInfo, _error: MeteringError) -> DeniedResponse:
    """503 with ``Retry-After: 5`` and a JSON body saying no decision was made."""
    body = {"error": "metering_unavailable", "message": "Usage limits cannot be checked now."}
    return DeniedResponse(
        503, [("content-type", "application/json"), ("retry-after", "5")], json.dumps(body).encode()
    )


# -- the policy ----------------------------------------------------------------


class PolicyOptions(TypedDict, total=False):
    """The optional settings of a middleware (see `MeteringMiddleware`)."""

    key: Key | None
    cost: int
    routes: Sequence[Route]
    stacking: bool
    headers: bool
    on_denied: DeniedBuilder | None
    on_unavailable: UndecidedBuilder | None
    fail_open: bool
    leases: bool


class Policy:
    """One middleware's configuration and its decision before the application runs."""

    def __init__(
        self,
        meter: Meter,
        limit: str,
        *,
        key: Key | None = None,
        cost: int = 1,
        routes: Sequence[Route] = (),
        stacking: bool = False,
        headers: bool = True,
        on_denied: DeniedBuilder | None = None,
        on_unavailable: UndecidedBuilder | None = None,
        fail_open: bool = False,
        leases: bool = True,
    ) -> None:
        if not isinstance(meter, Meter):
            raise InvalidInput("meter", f"expected a Meter, got {type(meter).__name__}")
        self.meter = meter
        self.limit = validate_limit_name(limit)
        self.key = key or client_ip()
        self.cost = validate_cost(cost)
        self.routes = tuple(routes)
        for route in self.routes:
            if route.limit is not None:
                validate_limit_name(route.limit)
            if route.cost is not None:
                validate_cost(route.cost)
        self.stacking = stacking
        self.headers = headers
        self.on_denied = on_denied or default_denied
        self.on_unavailable = on_unavailable or default_unavailable
        self.fail_open = fail_open
        self.leases = bool(leases)
        self._default_rule = (self.limit, self.cost)
        self._limits: dict[str, tuple[float, Limit | None]] = {}

    def _rule(self, request: RequestInfo) -> tuple[str, int] | None:
        if not self.routes:
            return self._default_rule
        method, path = request.method, request.path
        canonical = canonical_path(path)
        folded = canonical.lower()
        for route in self.routes:
            if route.matches_canonical(method, path, canonical, folded):
                if route.exempt:
                    return None
                return (route.limit or self.limit, route.cost or self.cost)
        return self._default_rule

    def _target(self, request: RequestInfo) -> tuple[str, str, int] | None:
        """(subject, limit, cost) to charge for this request, or None."""
        rule = self._rule(request)
        key = self.key(request) if rule is not None else None
        if rule is None or key is None:
            return None
        return (subject_of(key), *rule)

    def _undecided(self, request: RequestInfo, exc: MeteringError) -> Step:
        """No decision: the database is down (`StorageError`) or the setup is
        wrong (the limit was deleted while the app runs, a key function that
        returns no string). `on_unavailable`'s refusal (503), or let through
        uncharged with ``fail_open``."""
        cause = "unavailable" if isinstance(exc, StorageError) else "misconfigured"
        method, path = request.method, request.path
        if self.fail_open:
            log.warning("metering %s, %s %r let through uncharged: %s", cause, method, path, exc)
            return Step()
        refusal = self.on_unavailable(request, exc)
        log.error(
            "metering %s, %s %r refused with %d: %s", cause, method, path, refusal.status, exc
        )
        return Step(response=refusal)

    def enter(self, request: RequestInfo, context: RequestMetering) -> Step:
        """Charge this request (or not) and say whether it may go on."""
        try:
            target = self._target(request)
            if target is None:
                return Step()
            subject, limit, cost = target
            reservation: Reservation | LeasedReservation | None = None
            if self.stacking and self.leases:
                reservation = self.meter.lease_reservation(subject, limit, cost)
                decision = reservation.decision
            elif self.stacking:
                reservation = self.meter.reserve(subject, limit, cost)
                decision = reservation.decision
            elif self.leases:
                decision = self.meter.lease(subject, limit, cost)
            else:
                decision = self.meter.consume(subject, limit, cost)
            applied = Applied(limit, subject, decision, reservation)
            if decision.allowed:
                self._release_waiting(context)
            return self._conclude(request, context, applied)
        except MeteringError as exc:
            return self._undecided(request, exc)

    async def aenter(self, request: RequestInfo, context: RequestMetering) -> Step:
        """`enter` for asyncio: a plain limit awaits `Meter.aconsume` and holds
        no thread, or is decided from its lease in memory; a stacking one
        (reservations) runs `enter` in a thread unless its lease serves it."""
        try:
            target = self._target(request)
            if target is None:
                return Step()
            subject, limit, cost = target
            if self.stacking:
                held = self.meter.leases.take_held(subject, limit, cost) if self.leases else None
                if held is None:
                    return await asyncio.to_thread(self.enter, request, context)
                applied = Applied(limit, subject, held.decision, held)
            else:
                decision = await self._adecide(subject, limit, cost)
                applied = Applied(limit, subject, decision)
            if self.headers and self._limit_stale(limit):
                await asyncio.to_thread(self._limit, limit)
            if applied.decision.allowed and context.pending:
                if _in_memory(context.pending):
                    self._release_waiting(context)
                else:
                    await asyncio.to_thread(self._release_waiting, context)
            return self._conclude(request, context, applied)
        except MeteringError as exc:
            return self._undecided(request, exc)

    async def _adecide(self, subject: str, limit: str, cost: int) -> Decision:
        """A plain limit's decision: from the key's lease, from a new block
        (in a thread: one transaction), or by `Meter.aconsume`."""
        if not self.leases:
            return await self.meter.aconsume(subject, limit, cost)
        book = self.meter.leases
        decision = book.take(subject, limit, cost)
        if decision is not None:
            return decision
        if book.is_hot(subject, limit):
            return await asyncio.to_thread(book.lease, subject, limit, cost)
        decision = await self.meter.aconsume(subject, limit, cost)
        book.note(subject, limit, cost, decision)
        return decision

    @staticmethod
    def _release_waiting(context: RequestMetering) -> None:
        """This limit applies: limits waiting outside (stacking) are not charged."""
        for waiting in context.pending:
            if (
                waiting.reservation is not None
                and waiting.reservation.state == ReservationState.HELD
            ):
                waiting.reservation.cancel()
        context.pending.clear()

    def _conclude(self, request: RequestInfo, context: RequestMetering, applied: Applied) -> Step:
        decision = applied.decision
        context.applied.append(applied)
        context.effective = applied
        if not decision.allowed:
            now_us = self.meter.database.now_us()
            retry_after = retry_after_seconds(decision, now_us)
            log.info(
                "denied %s %s: %s by %s",
                request.method,
                request.path,
                applied.subject,
                applied.limit,
            )
            denied = self.on_denied(request, decision, retry_after)
            extra = [("retry-after", str(retry_after)), *self.header_pairs(applied, now_us)]
            present = {name.lower() for name, _ in denied.headers}
            headers = [*denied.headers, *((n, v) for n, v in extra if n not in present)]
            return Step(response=DeniedResponse(denied.status, headers, denied.body))
        if applied.reservation is not None:
            context.pending.append(applied)
        return Step(applied=applied)

    def leave(self, step: Step) -> None:
        """After the application: commit this middleware's reservation unless cancelled."""
        applied = step.applied
        if applied is None or applied.reservation is None:
            return
        if applied.reservation.state == ReservationState.HELD:
            try:
                applied.reservation.commit()
            except MeteringError as exc:  # the sweeper commits it after its time to live
                log.warning("reservation %s not committed now: %s", applied.reservation.id, exc)

    # -- headers ------------------------------------------------------------------

    def _limit_stale(self, name: str) -> bool:
        cached = self._limits.get(name)
        return cached is None or self.meter.clock().timestamp() - cached[0] > LIMIT_CACHE_SECONDS

    def _limit(self, name: str) -> Limit | None:
        if self._limit_stale(name):
            now = self.meter.clock().timestamp()
            try:
                self._limits[name] = (now, self.meter.get_limit(name))
            except MeteringError:
                self._limits[name] = (now, None)
        return self._limits[name][1]

    def header_pairs(self, applied: Applied, now_us: int) -> list[tuple[str, str]]:
        """``RateLimit-Policy`` and ``RateLimit`` (IETF httpapi draft) for a decision."""
        if not self.headers:
            return []
        charge = _charge_of(applied)
        if charge is None:
            return []
        window = _window_seconds(self._limit(applied.limit), charge)
        name = applied.limit.replace('"', "")
        policy = f'"{name}";q={charge.maximum}' + (f";w={window}" if window else "")
        reset = _seconds_until(charge.resets_at_us, now_us)
        return [
            ("ratelimit-policy", policy),
            ("ratelimit", f'"{name}";r={charge.remaining};t={reset}'),
        ]

    def response_headers(self, step: Step, context: RequestMetering) -> list[tuple[str, str]]:
        """Headers for the application's response, if this middleware's limit governs it."""
        if step.applied is None or context.effective is not step.applied:
            return []
        return self.header_pairs(step.applied, self.meter.database.now_us())


App = TypeVar("App")


class Middleware(Generic[App]):
    """What the ASGI and WSGI middlewares are made of: the application they
    wrap and their `Policy` (options: see `MeteringMiddleware`)."""

    def __init__(
        self,
        app: App,
        *,
        meter: Meter,
        limit: str,
        **options: Unpack[PolicyOptions],
    ) -> None:
        self.app = app
        self.policy = Policy(meter, limit, **options)


def _in_memory(waiting: Sequence[Applied]) -> bool:
    """Whether every waiting reservation is held in memory (from a lease)."""
    return all(isinstance(w.reservation, LeasedReservation) for w in waiting)


def _charge_of(applied: Applied) -> ChargeDecision | None:
    for charge in applied.decision.charges:
        if charge.limit == applied.limit:
            return charge
    return None


def _window_seconds(limit: Limit | None, charge: ChargeDecision) -> int | None:
    if limit is not None and limit.period_seconds:
        return limit.period_seconds
    if charge.window_start_us is not None:  # calendar months: this window's length
        return (charge.resets_at_us - charge.window_start_us) // 1_000_000
    return None
