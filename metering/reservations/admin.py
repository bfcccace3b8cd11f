"""Reservations as the meter opens and settles them (`metering.reservations.transactions`
holds their transactions) and as operators see them: lookup, listing, and
the sweep that commits those past their time to live."""

from __future__ import annotations

from sqlalchemy import Connection

from metering.domain.bounds import validate_count, validate_seconds
from metering.domain.events import UsageEvent, validate_event_id, validate_subject
from metering.domain.instants import from_us
from metering.domain.reservations import STORED_STATES
from metering.engine.core import Engine
from metering.errors import InvalidInput
from metering.reservations import transactions
from metering.reservations.handle import Reservation, ReservationInfo, Settler
from metering.storage.checkouts import CheckoutStore
from metering.storage.database import Database
from metering.storage.reservations import ReservationStore


class EngineSettler:
    """Settles reservations on one engine: a `Reservation`'s `Settler` where
    no `Meter` holds it (the lease book's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def cancel_reservation(self, reservation_id: str) -> int:
        return cancel(self.engine, reservation_id)

    def commit_reservation(self, reservation_id: str, actual: int | None = None) -> int:
        return commit(self.engine, reservation_id, actual)


def reserve(engine: Engine, settler: Settler, event: UsageEvent, ttl_seconds: float) -> Reservation:
    """Decide and record ``event`` like a consume and hold what it took."""
    ttl = transactions.validate_ttl(ttl_seconds)
    decision, state, expires_at_us = transactions.reserve(engine, event, round(ttl * 1_000_000))
    expires_at = from_us(expires_at_us) if expires_at_us is not None else None
    return Reservation(settler, decision, state, expires_at)


def cancel(engine: Engine, reservation_id: str) -> int:
    validate_event_id(reservation_id)
    return transactions.cancel(engine, reservation_id)


def commit(engine: Engine, reservation_id: str, actual: int | None) -> int:
    validate_event_id(reservation_id)
    return transactions.commit(engine, reservation_id, actual)


def reservation(database: Database, reservation_id: str) -> ReservationInfo | None:
    validate_event_id(reservation_id)
    record = database.run(lambda c: ReservationStore(c).get(reservation_id))
    return ReservationInfo.of(record) if record is not None else None


def reservations(
    database: Database, state: str | None, subject: str | None, count: int
) -> list[ReservationInfo]:
    """The ``count`` newest reservations, optionally of one state and subject."""
    if state is not None and state not in STORED_STATES:
        raise InvalidInput("state", "must be held, committed or cancelled")
    if subject is not None:
        validate_subject(subject)
    validate_count("count", count)
    records = database.run(lambda c: ReservationStore(c).list(state, subject, count))
    return [ReservationInfo.of(r) for r in records]


def sweep(database: Database, retention_seconds: float | None) -> dict[str, int]:
    """Commit reservations past their time to live and release checkouts past
    theirs (a floating license comes back at its expiry; this records it);
    with ``retention_seconds``, also delete settled reservations and released
    checkouts older than that. How many were committed, released and deleted."""
    if retention_seconds is not None:
        validate_seconds("retention_seconds", retention_seconds)
    now_us = database.now_us()

    def work(connection: Connection) -> dict[str, int]:
        rows, held = ReservationStore(connection), CheckoutStore(connection)
        committed = rows.commit_expired(now_us)
        released = held.release_expired(now_us)
        deleted = 0
        if retention_seconds is not None:
            before_us = now_us - round(retention_seconds * 1e6)
            deleted = rows.delete_settled_before(before_us) + held.delete_released_before(before_us)
        return {"committed": committed, "released": released, "deleted": deleted}

    return database.run(work)
