"""`Meter`'s methods for operators and customers: importing history,
backtesting a limit change, usage history and the usage page's links (a
part of the facade: each hands its call to the module that owns it)."""

from __future__ import annotations

from datetime import datetime

from metering import history, portal, simulation
from metering.domain.imports import ImportFormat
from metering.engine import Engine
from metering.history import UsageHistory
from metering.imports import ImportSummary, service
from metering.imports.service import BATCH_SIZE, Source
from metering.simulation import (
    EntitlementsSource,
    LimitsSource,
    Progress,
    Simulation,
    Since,
)
from metering.storage.database import Database


class OperatorsFacade:
    """Imports, backtests, usage history and portal links of a `metering.Meter`."""

    database: Database
    _engine: Engine

    def import_events(
        self,
        source: Source,
        *,
        fmt: ImportFormat | None = None,
        enforce: bool = True,
        allow_late: bool = False,
        strict: bool = False,
        batch_size: int = BATCH_SIZE,
        progress: service.Progress | None = None,
    ) -> ImportSummary:
        """Apply a JSON Lines or CSV file of events through the batch path, exactly once
        by id (``enforce=False``: history, never denied; ``allow_late``: no lateness)."""
        return service.import_events(
            self._engine,
            source,
            fmt=fmt,
            enforce=enforce,
            allow_late=allow_late,
            strict=strict,
            batch_size=batch_size,
            progress=progress,
        )

    def simulate(
        self,
        limits: LimitsSource,
        entitlements: EntitlementsSource = None,
        *,
        since: Since,
        subject: str | None = None,
        progress: Progress | None = None,
    ) -> Simulation:
        """Backtest: replay the ledger's demand since ``since`` through proposed
        limits and entitlements, in memory; nothing is written (`metering.simulation`)."""
        return simulation.simulate(
            self.database, limits, entitlements, since=since, subject=subject, progress=progress
        )

    def usage_history(
        self,
        subject: str,
        limit: str,
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: str = "day",
    ) -> UsageHistory:
        """``subject``'s use of ``limit`` per hour or day, with the maximum in force."""
        return history.usage_history(
            self.database, subject, limit, since=since, until=until, bucket=bucket
        )

    def portal_link(
        self, subject: str, ttl_seconds: int = 3600, base_url: str = "http://127.0.0.1:8000"
    ) -> str:
        """A signed link to ``subject``'s usage page (GET /portal) for ``ttl_seconds``."""
        return portal.make_link(self.database, subject, ttl_seconds, base_url)

    def rotate_portal_secret(self, grace_seconds: int = 86400) -> datetime:
        """Sign portal links with a new secret; older links work until the time returned."""
        return portal.rotate_link_secret(self.database, grace_seconds)
