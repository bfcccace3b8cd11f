"""The synchronous API: `Meter`, a facade whose methods hand each call to the
module that owns its feature (limits, engine, results, reservations,
leases, counters). The facade's methods of the newer features live beside
them and `Meter` takes them in: `metering.allowances.facade` (entitlements,
grants, alerts, voids), `metering.licenses.facade` (checkouts),
`metering.money.facade` (prices), `metering.imports.facade` (imports),
`metering.simulation.SimulationFacade` (backtests) and
`metering.usage.facade` (usage history, portal links). Each call is one
database transaction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import metering.limits.quarantine
import metering.limits.service
import metering.reservations.admin
from metering import settings
from metering.allowances.facade import AllowancesFacade
from metering.clock import Clock, system_clock
from metering.domain.bounds import validate_count
from metering.domain.decisions import Decision
from metering.domain.events import (
    EventRecord,
    Rejected,
    UsageEvent,
    charges_of,
    make_event,
    records_of,
    validate_cost,
)
from metering.domain.limits import Limit
from metering.domain.reservations import DEFAULT_TTL_SECONDS
from metering.engine import Engine
from metering.engine.answers import Answer, InvalidPolicy
from metering.imports.facade import ImportsFacade
from metering.licenses.facade import LicensesFacade
from metering.money.facade import PricesFacade
from metering.reservations import Reservation, ReservationInfo
from metering.reservations.leases import LeaseBook, LeasedReservation
from metering.settings import database_url
from metering.simulation import SimulationFacade
from metering.storage.breakers import Quarantine
from metering.storage.connections import ensure_schema
from metering.storage.database import Database
from metering.upkeep import dead_letters
from metering.usage import counters, results
from metering.usage.counters import Counter
from metering.usage.facade import UsageFacade

Charges = Sequence[Any] | None
Name = str | None  # a subject, limit or event id, if given
When = datetime | None
Leased = Reservation | LeasedReservation


class Meter(
    AllowancesFacade,
    LicensesFacade,
    PricesFacade,
    ImportsFacade,
    SimulationFacade,
    UsageFacade,
):
    """Meters usage against limits stored in a database: ``url`` else
    ``METERING_DATABASE_URL`` else ``sqlite:///metering.db``; ``clock`` gives
    every decision's "now"; concurrent `consume` calls share transactions
    unless ``group_commit=False``; ``correction_horizon_days`` bounds `void`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        group_commit: bool = True,
        correction_horizon_days: int | None = None,
        **engine_options: Any,
    ) -> None:
        days = correction_horizon_days  # checked before anything is opened
        if days is not None:
            days = validate_count(
                "correction_horizon_days", days, settings.MAX_CORRECTION_HORIZON_DAYS
            )
        self.correction_horizon = (
            settings.correction_horizon_days() if days is None else days
        ) * 86_400
        self.url = database_url(url)
        self.database = Database.connect(self.url, clock or system_clock, **engine_options)
        self.sql_engine = self.database.engine  # the database's engine and clock
        self.clock: Clock = self.database.clock
        self._engine = Engine(self.database, group_commit=group_commit)
        self._leases: LeaseBook | None = None
        try:
            ensure_schema(self.sql_engine)
        except BaseException:
            self.database.dispose()
            raise

    def close(self) -> None:
        if self._leases is not None:
            self._leases.close()  # settle every lease: their unused units go back
        self._engine.close()
        self.database.dispose()

    def connections_in_use(self) -> int | None:
        """Connections this process has open to PostgreSQL, all paths (None on SQLite)."""
        return self.database.connections_in_use()

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def set_limit(self, limit: Limit) -> Limit:
        """Create or replace a limit; `ReservedLimit` for ``metering.*`` names."""
        return metering.limits.service.set_limits(self.database, [limit])[0]

    def set_product_limit(self, limit: Limit) -> Limit:
        """Create or replace one of the product's own limits (``metering.*``)."""
        return metering.limits.service.set_product_limit(self.database, limit)

    def set_limits(self, limits: Iterable[Limit]) -> list[Limit]:
        """Create or replace several limits in one transaction (all or none)."""
        return metering.limits.service.set_limits(self.database, limits)

    def load_limits(self, path: str | Path) -> list[Limit]:
        """Validate a YAML or TOML file of limits and store them all, or none."""
        return metering.limits.service.load_limits(self.database, path)

    def get_limit(self, name: str) -> Limit:
        return metering.limits.service.get_limit(self.database, name)

    def list_limits(self) -> list[Limit]:
        return metering.limits.service.list_limits(self.database)

    def unknown_limits(self, names: Iterable[str]) -> list[str]:
        """Which of ``names`` no limit has (this process's cached limits,
        reloaded once on a miss)."""
        return self._engine.unknown_limits(names)

    def delete_limit(self, name: str) -> None:
        """Delete a limit; its counters stay, for reports."""
        metering.limits.service.delete_limit(self.database, name)

    def quarantines(self) -> list[Quarantine]:
        """The subjects a limit's breaker holds (docs/breaker.md)."""
        return metering.limits.quarantine.list_quarantines(self.database)

    def release_quarantine(self, subject: str, limit: str) -> Quarantine:
        """End ``subject``'s quarantine on ``limit`` (`NotQuarantined` if none)."""
        return metering.limits.quarantine.release(self.database, subject, limit)

    def _event(
        self,
        subject: Name,
        limit: Name,
        cost: int,
        charges: Charges,
        event_id: Name,
        occurred_at: When,
        metadata: Any = None,
    ) -> UsageEvent:
        when = self.clock() if occurred_at is None else occurred_at
        return make_event(charges_of(subject, limit, cost, charges), when, event_id, metadata)

    def consume(
        self,
        subject: Name = None,
        limit: Name = None,
        cost: int = 1,
        *,
        charges: Charges = None,
        event_id: Name = None,
        occurred_at: When = None,
        metadata: Any = None,
    ) -> Decision:
        """Decide and record one usage event (one charge or several), once per ``event_id``."""
        event = self._event(subject, limit, cost, charges, event_id, occurred_at, metadata)
        return results.consumed(event.event_id, self._engine.submit(event.record()))

    async def aconsume(
        self,
        subject: Name = None,
        limit: Name = None,
        cost: int = 1,
        *,
        charges: Charges = None,
        event_id: Name = None,
        occurred_at: When = None,
        metadata: Any = None,
    ) -> Decision:
        """`consume` for asyncio, in a shared transaction, without blocking the loop."""
        event = self._event(subject, limit, cost, charges, event_id, occurred_at, metadata)
        return results.consumed(event.event_id, await self._engine.submit_async(event.record()))

    def apply(
        self,
        events: Sequence[UsageEvent],
        *,
        invalid: InvalidPolicy = "reject",
        rejected: Sequence[Rejected] = (),
    ) -> results.Decisions:
        """Apply a batch of validated events in one transaction, in order:
        each event's `Decision` (an `EventConflict` for an id reused with
        other charges), made when read (`Decisions`)."""
        records = records_of(events)
        early = results.Early([record.event_id for record in records])
        answers = self._engine.apply(
            records, invalid=invalid, rejected=rejected, meanwhile=early.make
        )
        return early.decisions(answers)

    def apply_records(
        self,
        records: Sequence[EventRecord],
        *,
        invalid: InvalidPolicy = "reject",
        rejected: Sequence[Rejected] = (),
    ) -> list[Answer]:
        """`apply` for the worker: plain records in, (kind, result) answers out."""
        return self._engine.apply(records, invalid=invalid, rejected=rejected)

    def check(
        self,
        subject: Name = None,
        limit: Name = None,
        cost: int = 1,
        *,
        charges: Charges = None,
        occurred_at: When = None,
        metadata: Any = None,
    ) -> Decision:
        """What `consume` would decide now; consumes and records nothing (``metadata``:
        the value a seat limit would count)."""
        event = self._event(subject, limit, cost, charges, "check", occurred_at, metadata)
        return self._engine.check(event)

    def result(self, event_id: str) -> Decision | None:
        return results.result(self.database, event_id)

    def decided(self, event_ids: Iterable[str]) -> set[str]:
        return results.decided(self.database, event_ids)

    def outcome_counts(self) -> dict[str, int]:
        return results.outcome_counts(self.database)

    def count_results(self) -> int:
        return results.count_results(self.database)

    def rejected_messages(self, count: int = 100) -> list[Rejected]:
        """The ``count`` newest pieces of queued input that could not be applied."""
        return results.rejected_messages(self.database, count)

    def replay_rejected(self, count: int = 100) -> dead_letters.Replayed:
        """Apply up to ``count`` rejected events that are acceptable now
        (their limit defined since), each exactly once."""
        return dead_letters.replay(self.database, count)

    def reserve(
        self,
        subject: Name = None,
        limit: Name = None,
        cost: int = 1,
        *,
        charges: Charges = None,
        event_id: Name = None,
        metadata: Any = None,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
    ) -> Reservation:
        """Consume now, with the option to give the cost back (`Reservation.cancel`)."""
        event = self._event(subject, limit, cost, charges, event_id, None, metadata)
        return metering.reservations.admin.reserve(self._engine, self, event, ttl_seconds)

    def cancel_reservation(self, reservation_id: str) -> int:
        return metering.reservations.admin.cancel(self._engine, reservation_id)

    def commit_reservation(self, reservation_id: str, actual: int | None = None) -> int:
        return metering.reservations.admin.commit(self._engine, reservation_id, actual)

    def reservation(self, reservation_id: str) -> ReservationInfo | None:
        return metering.reservations.admin.reservation(self.database, reservation_id)

    def reservations(
        self,
        state: Name = None,
        subject: Name = None,
        count: int = 100,
    ) -> list[ReservationInfo]:
        return metering.reservations.admin.reservations(self.database, state, subject, count)

    def sweep_reservations(self, retention_seconds: float | None = None) -> dict[str, int]:
        """Commit expired reservations, release expired checkouts; delete settled
        ones past ``retention_seconds``."""
        return metering.reservations.admin.sweep(self.database, retention_seconds)

    @property
    def leases(self) -> LeaseBook:
        """This meter's leases (`metering.reservations.leases.LeaseBook`), made on first use."""
        if self._leases is None:
            self._leases = LeaseBook(self._engine)
        return self._leases

    def lease(self, subject: str, limit: str, cost: int = 1) -> Decision:
        """`consume` through this process's quota leases (`metering.reservations.leases`)."""
        return self.leases.lease(subject, limit, validate_cost(cost))

    def lease_reservation(self, subject: str, limit: str, cost: int = 1) -> Leased:
        """`reserve` through this process's quota leases."""
        return self.leases.reserve(subject, limit, validate_cost(cost))

    def settle_leases(self, *, everything: bool = False) -> int:
        """Settle the leases that are due, or all of them; how many were settled."""
        return self.leases.settle_due(everything=everything)

    def counters(self, subject: str | None = None, limit: str | None = None) -> list[Counter]:
        """Counters of a subject and/or limit, every window, oldest first."""
        return counters.counters(self.database, subject, limit)

    def seats(self, subject: str, limit: str, at: When = None) -> list[str]:
        """The values holding a seat of a distinct limit in the subject's window at ``at``."""
        return counters.seats(self.database, subject, limit, at)

    def reset(self, subject: str | None = None, limit: str | None = None) -> int:
        """Clear current counters; past windows stay. How many were cleared."""
        return counters.reset(self.database, subject, limit)
