"""Reservations: consume now, give back later if the usage did not happen.

`Meter.reserve` decides and records an event exactly like `consume`, and
when it is allowed keeps a durable reservation row naming the counters it
consumed from. Then exactly one of these happens:

* `cancel()` gives the cost back (see `metering.domain.reservations` for
  when a window or bucket can still take it) and marks it cancelled;
* `commit()`, leaving a ``with`` block, or the sweeper once its time to
  live has passed makes it final.

A reservation that is never settled therefore costs what it reserved: an
attacker who never finishes a login still pays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from metering.domain.decisions import Decision
from metering.domain.events import UsageEvent
from metering.domain.instants import from_us
from metering.domain.reservations import (
    MAX_TTL_SECONDS,
    HeldCharge,
    ReservationState,
    can_give_back,
    give_back,
)
from metering.domain.state import NO_WINDOW
from metering.errors import (
    EventConflict,
    InvalidInput,
    ReservationExpired,
    ReservationSettled,
    UnknownReservation,
)
from metering.ledger import apply_events
from metering.storage.queries import Store
from metering.storage.reservations import ReservationRecord, ReservationStore

if TYPE_CHECKING:
    from metering.meter import Meter


def validate_ttl(ttl_seconds: object) -> float:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise InvalidInput("ttl_seconds", f"must be a number of seconds, got {ttl_seconds!r}")
    if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidInput("ttl_seconds", f"must be above 0 and at most {MAX_TTL_SECONDS:.0f}")
    return float(ttl_seconds)


@dataclass(frozen=True, slots=True)
class ReservationInfo:
    """A stored reservation, as operators list it."""

    id: str
    state: str
    charges: tuple[HeldCharge, ...]
    created_at: datetime
    expires_at: datetime
    settled_at: datetime | None
    settled_by: str | None

    @classmethod
    def of(cls, record: ReservationRecord) -> ReservationInfo:
        settled = from_us(record.settled_at_us) if record.settled_at_us is not None else None
        return cls(
            id=record.id,
            state=record.state,
            charges=record.charges,
            created_at=from_us(record.created_at_us),
            expires_at=from_us(record.expires_at_us),
            settled_at=settled,
            settled_by=record.settled_by,
        )


class Reservation:
    """The answer to `Meter.reserve`: the decision, and the means to settle it.

    ``allowed`` is the decision's verdict. A denied reservation consumed
    nothing: its ``cancel()`` and ``commit()`` do nothing. Use it as a
    context manager: leaving the block without ``cancel()`` commits, even
    when the block raised. ``expires_at`` is when the sweeper commits it
    (None when nothing is held).
    """

    def __init__(
        self,
        meter: Meter,
        decision: Decision,
        state: ReservationState,
        expires_at: datetime | None = None,
    ) -> None:
        self._meter = meter
        self.decision = decision
        self.state: ReservationState = state
        self.expires_at = expires_at

    @property
    def id(self) -> str:
        assert self.decision.event_id is not None
        return self.decision.event_id

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    def cancel(self) -> int:
        """Give the cost back; returns the units returned (0 when nothing could be).

        A second cancel does nothing; cancelling a committed reservation
        raises `ReservationSettled` (`ReservationExpired` once its time to
        live has passed).
        """
        if self.state == "denied":
            return 0
        try:
            returned = self._meter.cancel_reservation(self.id)
        except ReservationSettled as exc:
            self.state = "committed" if exc.state == "committed" else self.state
            raise
        self.state = "cancelled"
        return returned

    def commit(self) -> None:
        """Make the usage final. Committing twice does nothing; after cancel it raises."""
        if self.state == "denied":
            return
        self._meter.commit_reservation(self.id)
        self.state = "committed"

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self.state == "held":
            self.commit()

    def __repr__(self) -> str:
        return f"<Reservation {self.id} {self.state} allowed={self.allowed}>"


Reserved = tuple[Decision, ReservationState, int | None]  # decision, state, expires_at_us


def reserve_work(event: UsageEvent, now_us: int, ttl_us: int) -> Callable[[Connection], Reserved]:
    """The transaction of `Meter.reserve`: decide, and keep a row if allowed."""

    # Like consume: no lookup of the id first; a repeated id is caught by the
    # results insert, and the retry then looks it up.
    precheck = False

    def work(connection: Connection) -> Reserved:
        nonlocal precheck
        try:
            [applied] = apply_events(
                Store(connection), [event], now_us, invalid="raise", precheck=precheck
            )
        except Exception:
            precheck = True
            raise
        if isinstance(applied, EventConflict):
            raise applied
        rows = ReservationStore(connection)
        if applied.duplicate:
            record = rows.get(event.event_id)
            if record is not None:
                return applied, record.state, record.expires_at_us  # type: ignore[return-value]
            # The id was consumed, not reserved: that usage is final.
            return applied, "committed" if applied.allowed else "denied", None
        if not applied.allowed:
            return applied, "denied", None
        # A fixed window's charge resets when its window ends: resets_at is the
        # window's end, which the counter key needs to find it again.
        held = [
            HeldCharge(
                subject=c.subject,
                limit=c.limit,
                cost=c.cost,
                window_start_us=c.window_start_us if c.window_start_us is not None else NO_WINDOW,
                window_end_us=c.resets_at_us if c.window_start_us is not None else NO_WINDOW,
            )
            for c in applied.charges
        ]
        rows.insert(event.event_id, held, now_us, now_us + ttl_us)
        return applied, "held", now_us + ttl_us

    return work


@dataclass(frozen=True, slots=True)
class Settled:
    """What a cancel or commit transaction did."""

    returned: int = 0
    expired: bool = False


def _locked(rows: ReservationStore, reservation_id: str) -> ReservationRecord:
    record = rows.get(reservation_id, lock=True)
    if record is None:
        raise UnknownReservation(reservation_id)
    return record


def cancel_work(reservation_id: str, now_us: int) -> Callable[[Connection], Settled]:
    def work(connection: Connection) -> Settled:
        rows = ReservationStore(connection)
        record = _locked(rows, reservation_id)
        if record.state == "cancelled":
            return Settled()
        if record.state != "held":
            raise ReservationSettled(reservation_id, record.state, "cancel")
        if record.expires_at_us <= now_us:
            # Past its time to live it is the sweeper's: commit it now, so the
            # answer does not depend on when the sweeper last ran.
            rows.settle(reservation_id, "committed", now_us, "expiry")
            return Settled(expired=True)
        returned = _give_back_all(connection, record, now_us)
        rows.settle(reservation_id, "cancelled", now_us, "cancel")
        return Settled(returned=returned)

    return work


def _give_back_all(connection: Connection, record: ReservationRecord, now_us: int) -> int:
    store = Store(connection)
    limits = store.load_limits(c.limit for c in record.charges)
    live = [c for c in record.charges if can_give_back(limits.get(c.limit), c, now_us)]
    if not live:
        return 0
    states = store.lock_counters([c.key for c in live], now_us)
    returned = 0
    changed = {}
    for charge in live:
        outcome = give_back(limits[charge.limit], charge, states[charge.key], now_us)
        states[charge.key] = changed[charge.key] = outcome.state
        returned += outcome.returned
    store.write_counters(changed, now_us)
    return returned


def commit_work(reservation_id: str, now_us: int) -> Callable[[Connection], None]:
    def work(connection: Connection) -> None:
        rows = ReservationStore(connection)
        record = _locked(rows, reservation_id)
        if record.state == "committed":
            return
        if record.state != "held":
            raise ReservationSettled(reservation_id, record.state, "commit")
        rows.settle(reservation_id, "committed", now_us, "commit")

    return work


def raise_if_expired(reservation_id: str, settled: Settled) -> int:
    if settled.expired:
        raise ReservationExpired(reservation_id)
    return settled.returned
