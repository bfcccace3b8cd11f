"""Reservations: consume now, give back later if the usage did not happen.

`Meter.reserve` decides and records an event exactly like `consume` and, when allowed, keeps
a durable reservation row naming the counters it consumed from (the transactions:
`metering.reservations.transactions`); callers hold a `Reservation`. Then exactly one of
these happens: `Reservation.cancel` gives the cost back (where a window or bucket can still
take it: `metering.domain.reservations`), or `Reservation.commit`, leaving a ``with`` block,
or the sweeper once its time to live has passed makes it final. A reservation never settled
costs what it reserved: an attacker who never finishes a login still pays.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

from metering.domain.corrections import GivenBack
from metering.domain.decisions import Decision
from metering.domain.instants import from_us
from metering.domain.reservations import HeldCharge, ReservationState
from metering.errors import ReservationExpired, ReservationSettled
from metering.storage.reservations import ReservationRecord


class Settler(Protocol):
    """What a `Reservation` needs to settle itself (a `Meter` is one)."""

    def cancel_reservation(self, reservation_id: str) -> int: ...

    def commit_reservation(self, reservation_id: str, actual: int | None = None) -> int: ...


@dataclass(frozen=True, slots=True)
class ReservationInfo:
    """A stored reservation, as operators list it."""

    id: str
    state: ReservationState
    charges: tuple[HeldCharge, ...]
    created_at: datetime
    expires_at: datetime
    settled_at: datetime | None
    settled_by: str | None
    # Per counter, the units of its charge that went back (cancel, void, commit of less).
    given_back: tuple[GivenBack, ...] = ()

    def given_back_of(self, charge: HeldCharge) -> int:
        """The units of ``charge`` that went back to its counter."""
        where = (charge.subject, charge.limit, charge.window_start_us)
        return sum(units for *counter, units in self.given_back if tuple(counter) == where)

    def to_dict(self) -> dict[str, Any]:
        """As the HTTP API and ``metering reservations list --format json`` show it."""
        return {
            "id": self.id,
            "state": str(self.state),
            "charges": [
                {
                    "subject": c.subject,
                    "limit": c.limit,
                    "cost": c.cost,
                    "given_back": self.given_back_of(c),
                }
                for c in self.charges
            ],
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "settled_at": self.settled_at.isoformat() if self.settled_at else None,
            "settled_by": self.settled_by,
        }

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
            given_back=record.given_back,
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
        settler: Settler,
        decision: Decision,
        state: ReservationState,
        expires_at: datetime | None = None,
    ) -> None:
        self._settler = settler
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
        if self.state == ReservationState.DENIED:
            return 0
        try:
            returned = self._settler.cancel_reservation(self.id)
        except ReservationSettled as exc:
            if exc.state == ReservationState.COMMITTED:
                self.state = ReservationState.COMMITTED
            raise
        self.state = ReservationState.CANCELLED
        return returned

    def commit(self, actual: int | None = None) -> int:
        """Make the usage final; returns the units given back.

        ``actual``: what the work really cost, from 0 to the reserved cost
        (of every charge): each charge is settled at ``actual`` and the rest
        goes back, once, as a cancel would give it back (a fixed window
        only while it is current). More than reserved is an `InvalidInput`.
        Committing twice does nothing; after cancel it raises; a commit of
        less than reserved past the time to live raises
        `ReservationExpired` (the whole cost stands, as the sweeper's).
        """
        if self.state == ReservationState.DENIED:
            return 0
        try:
            returned = self._settler.commit_reservation(self.id, actual)
        except ReservationExpired:
            self.state = ReservationState.COMMITTED
            raise
        self.state = ReservationState.COMMITTED
        return returned

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self.state == ReservationState.HELD:
            self.commit()

    def __repr__(self) -> str:
        return f"<Reservation {self.id} {self.state} allowed={self.allowed}>"
