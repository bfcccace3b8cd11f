"""`Meter`'s methods for floating licenses, each handed to
`metering.licenses.service` (a part of the facade, kept beside its feature)."""

from __future__ import annotations

from metering.domain.licenses import DEFAULT_TTL_SECONDS
from metering.licenses import service
from metering.licenses.service import Checkout
from metering.storage.database import Database

Name = str | None


class LicensesFacade:
    """Checkouts of concurrent limits of a `metering.Meter`."""

    database: Database

    def checkout(
        self,
        subject: str,
        limit: str,
        cost: int = 1,
        *,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        checkout_id: Name = None,
    ) -> Checkout:
        """Hold ``cost`` units of a concurrent limit until `checkin` or ``ttl_seconds``."""
        return service.checkout(self.database, subject, limit, cost, ttl_seconds, checkout_id)

    def checkin(self, checkout_id: str) -> int:
        """Give a checkout back: its cost the first time, 0 after or once expired."""
        return service.checkin(self.database, checkout_id)

    def renew(self, checkout_id: str, ttl_seconds: float | None = None) -> Checkout:
        """Hold a checkout ``ttl_seconds`` (default: its own) from now; never shorter."""
        return service.renew(self.database, checkout_id, ttl_seconds)

    def checkout_info(self, checkout_id: str) -> Checkout | None:
        return service.checkout_info(self.database, checkout_id)

    def checkouts(
        self, subject: Name = None, limit: Name = None, state: Name = None, count: int = 100
    ) -> list[Checkout]:
        return service.checkouts(self.database, subject, limit, state, count)
