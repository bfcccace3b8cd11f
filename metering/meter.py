"""The synchronous API: `Meter`.

Each call is one database transaction. `consume` decides and records an
event exactly once; `check` answers what would happen without recording.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from metering import allowances, counters, reservation_admin, reserving, results
from metering import limits as admin
from metering.allowances import Correction, Grant
from metering.clock import Clock, system_clock
from metering.counters import Counter
from metering.domain.bounds import validate_count
from metering.domain.decisions import Decision
from metering.domain.events import (
    EventRecord,
    Rejected,
    UsageEvent,
    charges_of,
    make_event,
    validate_cost,
    validate_event_id,
)
from metering.domain.grants import Entitlement
from metering.domain.instants import from_us
from metering.domain.limits import Limit
from metering.domain.reservations import DEFAULT_TTL_SECONDS
from metering.engine import Engine
from metering.engine.fast import CONFLICT, DUPLICATE, Answer
from metering.engine.reference import Decided, InvalidPolicy, decision_of
from metering.errors import EventConflict
from metering.leases import LeaseBook, LeasedReservation
from metering.reservations import Reservation, ReservationInfo
from metering.reserving import validate_ttl
from metering.settings import MAX_CORRECTION_HORIZON_DAYS, database_url
from metering.settings import correction_horizon_days as horizon_days
from metering.storage.database import Database
from metering.storage.engine import ensure_schema


class Meter:
    """Meters usage against limits stored in a database.

    ``Meter()`` uses ``METERING_DATABASE_URL``, else ``sqlite:///metering.db``
    (created on first use). ``clock`` is any callable returning an aware UTC
    datetime; every decision's "now" comes from it.

    Concurrent `consume` calls from several threads share transactions
    (group commit, see `metering.engine.group`); ``group_commit=False`` gives
    each call its own. `aconsume` always shares. ``correction_horizon_days``:
    how far back `void` reaches (the caller's `Settings`), else
    ``METERING_CORRECTION_HORIZON_DAYS``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        group_commit: bool = True,
        correction_horizon_days: int | None = None,
        **engine_options: Any,
    ) -> None:
        # Checked before anything is opened.
        days = (
            horizon_days()
            if correction_horizon_days is None
            else validate_count(
                "correction_horizon_days", correction_horizon_days, MAX_CORRECTION_HORIZON_DAYS
            )
        )
        self.url = database_url(url)
        self.database = Database.connect(self.url, clock or system_clock, **engine_options)
        # The database's engine and clock, as attributes of their own.
        self.engine = self.database.engine
        self.clock: Clock = self.database.clock
        self._engine = Engine(self.database, group_commit=group_commit)
        self.correction_horizon = days * 86_400
        self._leases: LeaseBook | None = None
        try:
            ensure_schema(self.engine)
        except BaseException:
            self.database.dispose()
            raise

    def close(self) -> None:
        if self._leases is not None:
            self._leases.close()  # settle every lease: their unused units go back
        self._engine.close()
        self.database.dispose()

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- limits ------------------------------------------------------------

    def set_limit(self, limit: Limit) -> Limit:
        """Create or replace a limit; events decided afterwards use it.
        `ReservedLimit` for a name of the product's own (``metering.*``)."""
        return admin.set_limits(self.database, [limit])[0]

    def set_product_limit(self, limit: Limit) -> Limit:
        """Create or replace one of the product's own limits (``metering.*``,
        e.g. the API's rate per key): the only way to write a reserved name."""
        return admin.set_product_limit(self.database, limit)

    def set_limits(self, limits: Iterable[Limit]) -> list[Limit]:
        """Create or replace several limits in one transaction (all or none)."""
        return admin.set_limits(self.database, limits)

    def load_limits(self, path: str | Path) -> list[Limit]:
        """Validate a YAML or TOML file of limits and store them all, or none."""
        return admin.load_limits(self.database, path)

    def get_limit(self, name: str) -> Limit:
        return admin.get_limit(self.database, name)

    def list_limits(self) -> list[Limit]:
        return admin.list_limits(self.database)

    def delete_limit(self, name: str) -> None:
        """Delete a limit. Its counters stay, for reports. `ReservedLimit`
        for a name of the product's own (``metering.*``)."""
        admin.delete_limit(self.database, name)

    # -- decisions -----------------------------------------------------------

    def _event(
        self,
        subject: str | None,
        limit: str | None,
        cost: int,
        charges: Sequence[Any] | None,
        event_id: str | None,
        occurred_at: datetime | None,
        metadata: Any = None,
    ) -> UsageEvent:
        charges = charges_of(subject, limit, cost, charges)
        when = self.clock() if occurred_at is None else occurred_at
        return make_event(charges, when, event_id, metadata)

    def consume(
        self,
        subject: str | None = None,
        limit: str | None = None,
        cost: int = 1,
        *,
        charges: Sequence[Any] | None = None,
        event_id: str | None = None,
        occurred_at: datetime | None = None,
        metadata: Any = None,
    ) -> Decision:
        """Decide and record one usage event, exactly once per ``event_id``.

        One charge (``subject, limit, cost``) or several (``charges=[(subject,
        limit, cost), ...]``, all or nothing). A repeated ``event_id`` returns
        the stored result with ``duplicate=True``; a repeated id with other
        charges raises `EventConflict`. Bad input raises before anything is stored.
        """
        event = self._event(subject, limit, cost, charges, event_id, occurred_at, metadata)
        return _consumed(event.event_id, self._engine.submit(event.record()))

    async def aconsume(
        self,
        subject: str | None = None,
        limit: str | None = None,
        cost: int = 1,
        *,
        charges: Sequence[Any] | None = None,
        event_id: str | None = None,
        occurred_at: datetime | None = None,
        metadata: Any = None,
    ) -> Decision:
        """`consume` for asyncio: awaits its turn in a shared transaction
        without blocking the event loop or holding a thread."""
        event = self._event(subject, limit, cost, charges, event_id, occurred_at, metadata)
        answer = await self._engine.submit_async(event.record())
        return _consumed(event.event_id, answer)

    def apply(
        self,
        events: Sequence[UsageEvent],
        *,
        invalid: InvalidPolicy = "reject",
        rejected: Sequence[Rejected] = (),
    ) -> list[Decided]:
        """Apply a batch of validated events in one transaction, in order.

        With ``invalid="reject"`` an event naming an unknown limit or out of
        its time range is recorded as rejected. In the same transaction,
        ``rejected`` (event id or None, reason, raw input) and every event
        whose id was reused with other charges are kept in
        ``rejected_messages``; a repeated call records nothing twice.
        """
        answers = self.apply_records(
            [event.record() for event in events], invalid=invalid, rejected=rejected
        )
        pairs = zip(events, answers, strict=True)
        return [_applied(event.event_id, answer) for event, answer in pairs]

    def apply_records(
        self,
        records: Sequence[EventRecord],
        *,
        invalid: InvalidPolicy = "reject",
        rejected: Sequence[Rejected] = (),
    ) -> list[Answer]:
        """`apply` for the worker: plain records in, (kind, result) answers out.

        A kind is ``"new"``, ``"duplicate"`` or ``"conflict"`` (see
        `metering.engine.fast`); nothing is built that the caller does not read.
        """
        return self._engine.apply(records, invalid=invalid, rejected=rejected)

    # -- reservations -------------------------------------------------------

    def reserve(
        self,
        subject: str | None = None,
        limit: str | None = None,
        cost: int = 1,
        *,
        charges: Sequence[Any] | None = None,
        event_id: str | None = None,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        metadata: Any = None,
    ) -> Reservation:
        """Consume now, with the option to give the cost back (`Reservation.cancel`).

        Decided and recorded like `consume` (same stacking, same exactly-once
        ``event_id``, which is also the reservation's id). An allowed
        reservation is held until cancelled or committed; after
        ``ttl_seconds`` the sweeper commits it.
        """
        ttl = validate_ttl(ttl_seconds)
        event = self._event(subject, limit, cost, charges, event_id, None, metadata)
        decision, state, expires_at_us = reserving.reserve(
            self._engine, event, round(ttl * 1_000_000)
        )
        expires_at = from_us(expires_at_us) if expires_at_us is not None else None
        return Reservation(self, decision, state, expires_at)

    # -- leases -----------------------------------------------------------------

    @property
    def leases(self) -> LeaseBook:
        """This meter's leases (`metering.leases.LeaseBook`), made on first use."""
        if self._leases is None:
            self._leases = LeaseBook(self)
        return self._leases

    def lease(self, subject: str, limit: str, cost: int = 1) -> Decision:
        """`consume` through this process's quota leases (`metering.leases`).

        For a key that is hot here, a block of units is reserved in one
        transaction and later calls are decided from memory until it is
        spent; a cold key, a token bucket, a soft or shadow limit and the
        last units of a window take the exact path (`consume`). The sum of
        used and leased units never exceeds the maximum; the unused part of
        a block goes back when it is settled (spent, idle for a second, near
        its window's end, `close`). A decision from a lease has the lease's
        id as ``event_id``: its block is the ledger's record.
        """
        return self.leases.lease(subject, limit, validate_cost(cost))

    def lease_reservation(
        self, subject: str, limit: str, cost: int = 1
    ) -> Reservation | LeasedReservation:
        """`reserve` through this process's quota leases: a hot key's
        reservation is held in memory (cancelled, its units go back to the
        lease); else a `Reservation` as from `reserve`."""
        return self.leases.reserve(subject, limit, validate_cost(cost))

    def _lease_block(self, event: UsageEvent, expires_at_us: int) -> reserving.Reserved | None:
        """A lease's block (`metering.reserving.lease`), for `metering.leases`."""
        return reserving.lease(self._engine, event, expires_at_us)

    def settle_leases(self, *, everything: bool = False) -> int:
        """Settle this process's leases that are due (idle, spent, near their
        window's end), or all of them; how many were settled. A thread of the
        meter's does this every quarter second once a lease is held."""
        return self.leases.settle_due(everything=everything)

    def cancel_reservation(self, reservation_id: str) -> int:
        """Cancel a held reservation: see `Reservation.cancel`."""
        validate_event_id(reservation_id)
        return reserving.cancel(self.database, reservation_id)

    def commit_reservation(self, reservation_id: str, actual: int | None = None) -> int:
        """Commit a held reservation, at ``actual`` if given: see `Reservation.commit`."""
        validate_event_id(reservation_id)
        return reserving.commit(self.database, reservation_id, actual)

    def reservation(self, reservation_id: str) -> ReservationInfo | None:
        return reservation_admin.reservation(self.database, reservation_id)

    def reservations(
        self, state: str | None = None, subject: str | None = None, count: int = 100
    ) -> list[ReservationInfo]:
        """The ``count`` newest reservations, optionally of one state and subject."""
        return reservation_admin.reservations(self.database, state, subject, count)

    def sweep_reservations(self, retention_seconds: float | None = None) -> dict[str, int]:
        """Commit reservations past their time to live (the beat task calls this);
        with ``retention_seconds``, delete settled ones older than that."""
        return reservation_admin.sweep(self.database, retention_seconds)

    def decided(self, event_ids: Iterable[str]) -> set[str]:
        """Which of these event ids have a stored result."""
        return results.decided(self.database, event_ids)

    def outcome_counts(self) -> dict[str, int]:
        """How many results there are of each outcome."""
        return results.outcome_counts(self.database)

    def count_results(self) -> int:
        return results.count_results(self.database)

    def rejected_messages(self, count: int = 100) -> list[Rejected]:
        """The ``count`` newest pieces of queued input that could not be applied."""
        return results.rejected_messages(self.database, count)

    def check(
        self,
        subject: str | None = None,
        limit: str | None = None,
        cost: int = 1,
        *,
        charges: Sequence[Any] | None = None,
        occurred_at: datetime | None = None,
    ) -> Decision:
        """What `consume` would decide now; consumes and records nothing.

        On PostgreSQL the hot path's rules decide over state read in one
        statement, outside any transaction (`check_record`); the general
        engine answers what they leave to it, and on SQLite.
        """
        event = self._event(subject, limit, cost, charges, "check", occurred_at)
        return self._engine.check(event)

    def result(self, event_id: str) -> Decision | None:
        """The stored result of an event, or None if it has not been decided."""
        return results.result(self.database, event_id)

    def reset(self, subject: str | None = None, limit: str | None = None) -> int:
        """Clear current counters (operator action); past windows stay for reports.
        Give a subject, a limit or both; how many counters were cleared."""
        return counters.reset(self.database, subject, limit)

    # -- entitlements, grants, corrections ------------------------------------

    def set_entitlement(
        self,
        subject: str,
        limit: str,
        maximum: int | None,
        effective_from: datetime | None = None,
    ) -> Entitlement:
        """Give ``subject`` its own maximum for ``limit`` from ``effective_from``
        (default: now) on. An upgrade mid-window applies from then on, and
        the window's usage carries over; None returns the subject to the
        limit's default. Past decisions and reports keep the maximum that
        applied at their time."""
        return allowances.set_entitlement(self.database, subject, limit, maximum, effective_from)

    def load_entitlements(self, path: str | Path) -> list[Entitlement]:
        """Store a YAML or TOML file of per-subject maximums, all or none."""
        return allowances.load_entitlements(self.database, path)

    def delete_entitlement(
        self, subject: str, limit: str, effective_from: datetime | None = None
    ) -> Entitlement:
        """Return ``subject`` to ``limit``'s default maximum from ``effective_from`` (now) on."""
        return allowances.set_entitlement(self.database, subject, limit, None, effective_from)

    def entitlements(
        self, subject: str | None = None, limit: str | None = None
    ) -> list[Entitlement]:
        """Every change of a subject's maximum, oldest first per subject and limit."""
        return allowances.entitlements(self.database, subject, limit)

    def grant(
        self,
        subject: str,
        limit: str,
        amount: int,
        expires_at: datetime | None = None,
        *,
        grant_id: str | None = None,
        effective_from: datetime | None = None,
        reason: str | None = None,
    ) -> Grant:
        """Top up ``subject``'s allowance for ``limit`` by ``amount`` until
        ``expires_at`` (exclusive; None: never). Idempotent by ``grant_id``."""
        return allowances.add_grant(
            self.database,
            subject,
            limit,
            amount,
            expires_at=expires_at,
            grant_id=grant_id,
            effective_from=effective_from,
            reason=reason,
        )

    def grants(self, subject: str | None = None, limit: str | None = None) -> list[Grant]:
        """Grants with what is used and left of each (at most 1,000)."""
        return allowances.list_grants(self.database, subject, limit)

    def void(
        self,
        event_id: str,
        reason: str,
        *,
        correction_id: str | None = None,
        horizon_seconds: int | None = None,
    ) -> Correction:
        """Reverse an allowed event's charges in their own windows' counters
        (past ones too) and give back the grants that paid, if still active.
        The event's result stays; the correction references it. Idempotent by
        event and by ``correction_id``. ``horizon_seconds`` (default:
        ``METERING_CORRECTION_HORIZON_DAYS``, else 35 days) bounds how far back."""
        horizon = horizon_seconds if horizon_seconds is not None else self.correction_horizon
        return allowances.void(
            self.database, event_id, reason, correction_id=correction_id, horizon_seconds=horizon
        )

    def corrections(self, count: int = 1000) -> list[Correction]:
        """Voided events, oldest first."""
        return allowances.corrections(self.database, count)

    def counters(self, subject: str | None = None, limit: str | None = None) -> list[Counter]:
        """Counters of a subject and/or limit, every window, oldest first."""
        return counters.counters(self.database, subject, limit)


def _consumed(event_id: str, answer: Answer) -> Decision:
    applied = _applied(event_id, answer)
    if isinstance(applied, EventConflict):
        raise applied
    return applied


def _applied(event_id: str, answer: Answer) -> Decided:
    kind, record = answer
    if kind == CONFLICT or record is None:
        return EventConflict(event_id)
    return decision_of(record, duplicate=kind == DUPLICATE)
