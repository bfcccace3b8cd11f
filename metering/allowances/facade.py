"""`Meter`'s methods for per-customer allowances: entitlements, grants
(recurring too), alert thresholds, time zones and voids, each handed to
`metering.allowances` (a part of the facade, kept beside its feature)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from metering import allowances
from metering.allowances.alerts import Alert
from metering.allowances.service import Correction, Grant, RecurringGrant
from metering.allowances.zones import SubjectZone, set_time_zone, subject_zone, subject_zones
from metering.domain.grants import DEFAULT_PRIORITY, Entitlement
from metering.storage.database import Database


class AllowancesFacade:
    """Entitlements, grants, alerts and corrections of a `metering.Meter`."""

    database: Database
    correction_horizon: int

    def set_entitlement(
        self, subject: str, limit: str, maximum: int | None, effective_from: datetime | None = None
    ) -> Entitlement:
        """Give ``subject`` its own maximum for ``limit`` from ``effective_from`` on."""
        return allowances.set_entitlement(self.database, subject, limit, maximum, effective_from)

    def load_entitlements(self, path: str | Path) -> list[Entitlement]:
        """Store a YAML or TOML file of per-subject maximums, all or none."""
        return allowances.load_entitlements(self.database, path)

    def delete_entitlement(
        self,
        subject: str,
        limit: str,
        effective_from: datetime | None = None,
    ) -> Entitlement:
        """Return ``subject`` to ``limit``'s default maximum from ``effective_from`` on."""
        return allowances.set_entitlement(self.database, subject, limit, None, effective_from)

    def entitlements(
        self,
        subject: str | None = None,
        limit: str | None = None,
    ) -> list[Entitlement]:
        return allowances.entitlements(self.database, subject, limit)

    def set_time_zone(self, subject: str, time_zone: str) -> SubjectZone:
        """Align ``subject``'s calendar windows of days and months on its local midnight
        in ``time_zone`` (IANA), from the end of each current window on."""
        return set_time_zone(self.database, subject, time_zone)

    def subject_zone(self, subject: str) -> SubjectZone:
        """``subject``'s time zone (UTC when it was never given one)."""
        return subject_zone(self.database, subject)

    def subject_zones(self) -> list[SubjectZone]:
        """Every subject given a time zone."""
        return subject_zones(self.database)

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
        every: str | None = None,
        rollover_max: int | None = None,
        priority: int = DEFAULT_PRIORITY,
        until: datetime | None = None,
        low: int | str | None = None,
    ) -> Grant:
        """Top up ``subject``'s allowance for ``limit`` (``every``: recurring, `add_grant`)."""
        return allowances.add_grant(
            self.database,
            subject,
            limit,
            amount,
            expires_at=expires_at,
            grant_id=grant_id,
            effective_from=effective_from,
            reason=reason,
            every=every,
            rollover_max=rollover_max,
            priority=priority,
            until=until,
            low=low,
        )

    def grants(self, subject: str | None = None, limit: str | None = None) -> list[Grant]:
        return allowances.list_grants(self.database, subject, limit)

    def recurring_grants(
        self,
        subject: str | None = None,
        limit: str | None = None,
    ) -> list[RecurringGrant]:
        return allowances.list_recurring(self.database, subject, limit)

    def set_alert(self, subject: str, limit: str, at: Iterable[str | int]) -> Alert:
        """``subject``'s own thresholds for ``limit`` (``["80%", 5000]``), replacing the limit's."""
        return allowances.set_alert(self.database, subject, limit, at)

    def alerts(self, subject: str | None = None, limit: str | None = None) -> list[Alert]:
        return allowances.list_alerts(self.database, subject, limit)

    def remove_alert(self, subject: str, limit: str) -> bool:
        return allowances.remove_alert(self.database, subject, limit)

    def void(
        self,
        event_id: str,
        reason: str,
        *,
        correction_id: str | None = None,
        horizon_seconds: int | None = None,
    ) -> Correction:
        """Reverse an allowed event's charges and give back the grants that paid."""
        horizon = self.correction_horizon if horizon_seconds is None else horizon_seconds
        return allowances.void(
            self.database, event_id, reason, correction_id=correction_id, horizon_seconds=horizon
        )

    def corrections(self, count: int = 1000) -> list[Correction]:
        return allowances.corrections(self.database, count)
